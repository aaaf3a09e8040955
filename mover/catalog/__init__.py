"""Reads of the PostgreSQL catalog and what mover derives from them: table descriptions, the recorded
shape, metadata, privileges, type conversions, publications. No step logic."""
