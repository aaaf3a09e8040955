"""mover in a Django project (the `django` extra; docs/django.md).

Add "mover.contrib.django" to INSTALLED_APPS: `manage.py mover ...` then runs any mover command
against a database of DATABASES (management/commands/mover.py, the DSN from connection.py), and
a migration hands a table to mover with the operations of operations.py, `StartMove` and
`MoveTable`, while Django's migration state follows (the SeparateDatabaseAndState pattern).
"""
