"""mover inside other tools' migrations: each module drives mover through mover/api.py from the
framework's own migration files (mover/contrib/alembic.py: Alembic's revisions). A module imports
its framework, which mover itself does not need at run time."""
