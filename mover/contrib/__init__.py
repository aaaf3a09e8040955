"""mover inside the frameworks a project already changes its schema with: each module drives mover
through mover/api.py from the framework's own migration files (alembic.py: operations for
Alembic's revisions; alembic_autogenerate.py: what `alembic revision --autogenerate` writes with
them; django/: `manage.py mover` and migration operations). Each integration is optional:
importing one needs its framework (the package's extra of that name); nothing below this layer
imports them."""
