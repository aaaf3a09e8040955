"""mover.contrib.django without a project: DATABASES' settings as a libpq DSN (Django's own mapping,
the password masked wherever mover prints), and the arguments `manage.py mover` passes on."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from mover.contrib.django.connection import libpq_dsn
from mover.contrib.django.management.commands.mover import database_option, without_django_options
from mover.db import mask, own_secrets, remember_secrets
from mover.errors import BadInput

# Every character a password may hold that a DSN quotes or escapes.
PASSWORD = "p w'\\d=\"x@y:z/%"


def settings(**kw) -> dict:
    return {"ENGINE": "django.db.backends.postgresql", "NAME": "shop", "USER": "app", "PASSWORD": PASSWORD,
            "HOST": "db.internal", "PORT": 6432, "OPTIONS": {}, **kw}


def test_the_settings_become_libpq_keywords():
    dsn = libpq_dsn("default", settings(OPTIONS={"sslmode": "require", "application_name": "shop web",
                                                 "connect_timeout": 5}))
    assert conninfo_to_dict(dsn) == {"dbname": "shop", "user": "app", "password": PASSWORD, "host": "db.internal",
                                     "port": "6432", "sslmode": "require", "application_name": "shop web",
                                     "connect_timeout": "5"}


def test_the_password_is_masked_in_anything_mover_prints():
    dsn = libpq_dsn("default", settings())
    with own_secrets():
        remember_secrets(dsn)
        for text in (dsn, f'connection to server failed: {dsn}', repr(dsn)):
            assert "p w" not in mask(text) and "x@y:z" not in mask(text), mask(text)


def test_options_of_the_backend_are_left_out_and_assume_role_is_a_startup_option():
    dsn = libpq_dsn("default", settings(OPTIONS={
        "isolation_level": 3, "pool": True, "server_side_binding": True, "prepare_threshold": 5,
        "options": "-c statement_timeout=0", "assume_role": "shop owner"}))
    info = conninfo_to_dict(dsn)
    assert info["options"] == "-c statement_timeout=0 -c role=shop\\ owner"
    assert not {"isolation_level", "pool", "server_side_binding", "prepare_threshold", "assume_role"} & set(info)


def test_name_none_is_the_postgres_database_and_a_service_may_stand_for_the_name():
    assert conninfo_to_dict(libpq_dsn("default", settings(NAME=None)))["dbname"] == "postgres"
    info = conninfo_to_dict(libpq_dsn("default", {"NAME": "", "OPTIONS": {"service": "shop"}}))
    assert info == {"service": "shop"}
    with pytest.raises(BadInput, match="neither NAME nor OPTIONS"):
        libpq_dsn("default", {"NAME": "", "OPTIONS": {}})


def test_an_option_libpq_does_not_know_is_named():
    with pytest.raises(BadInput, match="sslmod\\b"):
        libpq_dsn("reports", settings(OPTIONS={"sslmod": "require"}))


def test_manage_py_mover_passes_every_argument_on_but_its_own():
    assert database_option(["status", "--database", "replica", "--json"]) == ("replica", ["status", "--json"])
    assert database_option(["--database=replica", "run", "plan.toml"]) == ("replica", ["run", "plan.toml"])
    assert database_option(["run", "--", "--database", "x"]) == (None, ["run", "--", "--database", "x"])
    assert without_django_options(["--settings", "site.settings", "status", "--pythonpath=/srv", "--json"]) == \
        ["status", "--json"]
