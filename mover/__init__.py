"""mover: move a live PostgreSQL table into a new one, swap it in, keep a rollback window."""

__version__ = "0.1.0"
