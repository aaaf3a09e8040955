"""Reads of the PostgreSQL catalog and what mover derives from them: table descriptions, the recorded
shape, privileges, type conversions (and the column mapping they give), publications. No step
logic, no statements run on user tables (those are the engines': mover/engines/)."""
