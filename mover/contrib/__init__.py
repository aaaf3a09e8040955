"""mover inside other tools' migrations: each module drives mover through mover/api.py from the
framework's own migration files (mover/contrib/alembic.py: operations for Alembic's revisions;
mover/contrib/alembic_autogenerate.py: what `alembic revision --autogenerate` writes with them).
Each imports its framework; nothing below this layer imports them."""
