"""The libpq DSN of a database of the project's DATABASES, so that mover connects where Django
does and there is no second DSN to keep in step with the settings.

The mapping is Django's own (django/db/backends/postgresql/base.py, get_connection_params): NAME,
USER, PASSWORD, HOST and PORT become dbname, user, password, host and port; OPTIONS' libpq keys
(sslmode, service, options, connect_timeout...) pass through; the keys the backend consumes
itself are left out. The password is part of the DSN: it is printed nowhere, because every text
mover prints goes through mover.db.mask, which knows the passwords of the DSNs it was given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from mover.errors import BadInput

# OPTIONS keys that are the backend's, not libpq's. isolation_level, pool, server_side_binding,
# prepare_threshold, cursor_factory and context shape Django's own connections (mover sets its own
# per transaction); assume_role is a SET ROLE after connecting, carried below as a startup option.
BACKEND_OPTIONS = frozenset({"isolation_level", "pool", "server_side_binding", "prepare_threshold",
                             "cursor_factory", "context", "assume_role"})


def database_dsn(alias: str) -> str:
    """The DSN of DATABASES[alias]; BadInput when there is no such alias or it is not PostgreSQL."""
    if alias not in connections:
        known = ", ".join(repr(a) for a in connections)
        raise BadInput(f"DATABASES has no database {alias!r} (it has {known})",
                       hint="name one of them with --database ALIAS")
    return connection_dsn(connections[alias])


def connection_dsn(connection: BaseDatabaseWrapper) -> str:
    """The DSN of the database behind one of Django's connections (a migration's schema editor's)."""
    if connection.vendor != "postgresql":
        raise BadInput(f"DATABASES[{connection.alias!r}] is a {connection.vendor} database "
                       f"(ENGINE {connection.settings_dict.get('ENGINE')!r}); mover moves PostgreSQL tables only",
                       hint="name a PostgreSQL database with --database ALIAS")
    return libpq_dsn(connection.alias, connection.settings_dict)


def libpq_dsn(alias: str, settings: Mapping[str, Any]) -> str:
    """A settings dict of DATABASES as a libpq key=value DSN (quoted by psycopg)."""
    options = dict(settings.get("OPTIONS") or {})
    params: dict[str, Any] = {}
    name = settings.get("NAME")
    if name is None:
        params["dbname"] = "postgres"  # as Django: NAME None connects to the "postgres" database
    elif name:
        params["dbname"] = name
    elif not options.get("service"):
        raise BadInput(f"DATABASES[{alias!r}] has neither NAME nor OPTIONS['service']",
                       hint="set NAME (or a libpq service) in the project's settings")
    unknown = sorted(k for k in options if k not in BACKEND_OPTIONS and k not in _libpq_keywords())
    if unknown:
        raise BadInput(f"DATABASES[{alias!r}]['OPTIONS'] has keys that are neither libpq's nor Django's "
                       f"PostgreSQL backend's: {', '.join(unknown)}",
                       hint="remove them (libpq's keys: https://www.postgresql.org/docs/current/"
                            "libpq-connect.html#LIBPQ-PARAMKEYWORDS)")
    params.update({k: v for k, v in options.items() if k not in BACKEND_OPTIONS and v is not None})
    for setting, keyword in (("USER", "user"), ("PASSWORD", "password"), ("HOST", "host"), ("PORT", "port")):
        if settings.get(setting):
            params[keyword] = str(settings[setting])
    if options.get("assume_role"):
        # Django runs SET ROLE after connecting; libpq's startup option does the same for mover's sessions.
        role = f"-c role={_option_value(str(options['assume_role']))}"
        params["options"] = f"{params['options']} {role}" if params.get("options") else role
    return psycopg.conninfo.make_conninfo("", **{k: str(v) for k, v in params.items()})


def _option_value(value: str) -> str:
    """A value inside libpq's `options`: spaces and backslashes escaped with a backslash."""
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


def _libpq_keywords() -> set[str]:
    return {o.keyword.decode() for o in psycopg.pq.Conninfo.get_defaults()}
