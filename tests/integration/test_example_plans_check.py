"""Each example plan in plans/ passes `plan check` against a database holding the table it
names (run in-process through mover.api.check_plan, the code the CLI calls)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mover import api
from tests.conftest import connect

PLANS = Path(__file__).resolve().parents[2] / "plans"

# public.events partitioned by month, a DEFAULT partition holding a few rows, key (id, created_at).
MONTHLY_EVENTS = """
    CREATE TABLE public.events (id int NOT NULL, created_at timestamptz NOT NULL, body text,
                                PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at);
    CREATE TABLE public.events_this_month PARTITION OF public.events
        FOR VALUES FROM (date_trunc('month', now())) TO (date_trunc('month', now()) + interval '1 month');
    CREATE TABLE public.events_default PARTITION OF public.events DEFAULT;
    INSERT INTO public.events SELECT g, now() - g * interval '1 day', 'e' FROM generate_series(1, 20) g;
"""

# The tables the example plans name, in the shapes their comments describe.
TABLES = {
    "int_to_bigint.toml": """
        CREATE TABLE public.orders (id serial PRIMARY KEY, customer text NOT NULL, total numeric(12,2));
        INSERT INTO public.orders (customer, total) SELECT 'c' || g, g FROM generate_series(1, 20) g;
    """,
    "rebuild.toml": """
        CREATE TABLE public.events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, payload jsonb)
            WITH (fillfactor = 90);
        CREATE INDEX events_payload_idx ON public.events USING gin (payload);
        INSERT INTO public.events (payload) SELECT jsonb_build_object('n', g) FROM generate_series(1, 20) g;
    """,
    "partitioned-int-to-bigint.toml": MONTHLY_EVENTS,
    "partitioned-monthly-to-daily.toml": MONTHLY_EVENTS,
    "partitioned-to-one-table.toml": MONTHLY_EVENTS,
    "partition-monthly.toml": """
        CREATE TABLE public.events (id bigint PRIMARY KEY, created_at timestamptz NOT NULL, body text);
        INSERT INTO public.events SELECT g, now() - g * interval '1 day', 'e' FROM generate_series(1, 20) g;
    """,
    "partition-daily-retention.toml": """
        CREATE TABLE public.request_log (id bigint PRIMARY KEY, logged_at timestamptz NOT NULL, path text);
        INSERT INTO public.request_log SELECT g, now() - g * interval '1 hour', '/' FROM generate_series(1, 20) g;
    """,
    "partition-hash-tenant.toml": """
        CREATE TABLE public.accounts (id bigint PRIMARY KEY, tenant_id int NOT NULL, name text);
        INSERT INTO public.accounts SELECT g, g % 5, 'a' FROM generate_series(1, 20) g;
    """,
    "partition-list-region.toml": """
        CREATE TABLE public.customers (id bigint PRIMARY KEY, region text NOT NULL, name text);
        INSERT INTO public.customers
        SELECT g, (ARRAY['de', 'us', 'jp', 'br'])[1 + g % 4], 'c' FROM generate_series(1, 20) g;
    """,
    "mixed_case.toml": """
        CREATE SCHEMA "Billing";
        CREATE TABLE "Billing"."InvoiceLines" ("LineId" integer PRIMARY KEY, "Amount" numeric NOT NULL);
        INSERT INTO "Billing"."InvoiceLines" SELECT g, g FROM generate_series(1, 20) g;
    """,
}


def test_every_example_plan_has_a_table():
    assert sorted(p.name for p in PLANS.glob("*.toml")) == sorted(TABLES)


@pytest.mark.parametrize("file", sorted(TABLES))
def test_example_plan_passes_plan_check(db_dsn, file):
    with connect(db_dsn) as conn:
        conn.execute(TABLES[file])
    out = api.check_plan(db_dsn, PLANS / file)
    assert out["registered"] is False
    assert [s["name"] for s in out["steps"]] == [
        "create_target", "install_capture", "backfill", "reconcile", "cutover", "rollback_window", "retire"]
    assert all(s["sql"] for s in out["steps"] if s["name"] in ("create_target", "install_capture"))
    # Checking changed nothing: no new table and no registered migration.
    with connect(db_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM mover.migrations").fetchone() == (0,)
        target = out["tables"]["target"]
        assert conn.execute("SELECT to_regclass(%s)", (target,)).fetchone() == (None,)
