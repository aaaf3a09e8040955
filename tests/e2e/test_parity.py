"""The rest of the table's metadata survives the swap and the swap back, and the parity gate refuses
a difference nothing planned (issue 10). Judged by plain catalog queries, not only by `mover parity`."""

from __future__ import annotations

import json

import psycopg

from mover.engines.swap import parity as mover_parity
from tests.workload import Writer, assert_oracle, create_orders, cutover_with_change_before_lock, mover, plan_file

METADATA = """
ALTER TABLE "Orders" REPLICA IDENTITY USING INDEX "Orders_pkey";
CREATE PUBLICATION orders_pub FOR TABLE "Orders" (id, "Account", amount, status) WHERE (id > 0);
CREATE STATISTICS orders_account_status (ndistinct, dependencies) ON "Account", status FROM "Orders";
ALTER STATISTICS orders_account_status SET STATISTICS 200;
ALTER TABLE "Orders" ALTER amount SET STATISTICS 500;
ALTER TABLE "Orders" ALTER note SET STORAGE EXTERNAL;
ALTER TABLE "Orders" ALTER payload SET COMPRESSION pglz;
GRANT SELECT ON "Orders" TO PUBLIC;
"""


def parity_plan(tmp_path, accept: list[str] | None = None) -> str:
    cutover = {"lock_timeout": "500ms", **({"accept_parity": accept} if accept else {})}
    return plan_file(tmp_path, "parity", columns={"id": "bigint"}, backfill={"chunk_rows": 1000}, cutover=cutover)


def parity(dsn: str) -> tuple[int, dict]:
    r = mover(dsn, "parity", "parity", "--json")
    assert r.returncode in (0, 3), r.stderr
    return r.returncode, json.loads(r.stdout)


def metadata(dsn: str, table: str) -> dict:
    """What the application and replication see of `table`, read independently of mover."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        oid = conn.execute("SELECT %s::regclass::oid", (f'"{table}"',)).fetchone()[0]
        ident = conn.execute("SELECT c.relreplident, (SELECT ic.relname FROM pg_index i JOIN pg_class ic"
                             " ON ic.oid = i.indexrelid WHERE i.indrelid = c.oid AND i.indisreplident)"
                             " FROM pg_class c WHERE c.oid = %s", (oid,)).fetchone()
        pubs = conn.execute("SELECT p.pubname, pr.prattrs::text, pg_get_expr(pr.prqual, pr.prrelid)"
                            " FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid"
                            " WHERE pr.prrelid = %s", (oid,)).fetchall()
        # The default target reads NULL from PostgreSQL 17 on, -1 before: -1 here on every version.
        stats = conn.execute("SELECT stxname, coalesce(stxstattarget::int, -1) FROM pg_statistic_ext"
                             " WHERE stxrelid = %s", (oid,)).fetchall()
        cols = conn.execute("SELECT attname, coalesce(attstattarget::int, -1), attstorage::text, attcompression::text"
                            " FROM pg_attribute WHERE attrelid = %s AND attname IN ('amount', 'note', 'payload')"
                            " ORDER BY 1", (oid,)).fetchall()
        grants = conn.execute("SELECT has_table_privilege('public', %s, 'SELECT')", (oid,)).fetchone()[0]
    return {"identity": ident, "publications": pubs, "statistics": stats, "columns": cols, "public_select": grants}


EXPECTED = {
    "identity": ("i", "Orders_pkey"),
    "publications": [("orders_pub", "1 2 3 4", "(id > 0)")],
    "statistics": [("orders_account_status", 200)],
    "columns": [("amount", 500, "m", ""), ("note", -1, "e", ""), ("payload", -1, "x", "p")],
    "public_select": True,
}


def test_metadata_survives_swap_and_rollback_under_writer(db_dsn, tmp_path):
    create_orders(db_dsn, 3_000)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(METADATA)
    assert metadata(db_dsn, "Orders") == EXPECTED
    plan = parity_plan(tmp_path)
    r = mover(db_dsn, "plan", "check", plan, "--json")
    assert r.returncode == 0, r.stderr
    notes = json.loads(r.stdout)["metadata"]
    assert notes["at_swap"] == ['replica identity USING INDEX "Orders_pkey" (the new table\'s copy)',
                                'membership of publication "orders_pub" (with its column list and row filter;'
                                " the old table leaves it)",
                                'subscribers of publication "orders_pub" receive column "id" as bigint: change its type'
                                " on each subscriber before the cutover, or their apply stops on the first value the"
                                " old type cannot hold"]
    assert [n.split(" of column")[0] for n in notes["at_create_target"][:3]] == [
        "statistics target 500", "the compression setting", "the storage setting"]
    assert notes["not_carried"] == []
    writer = Writer(db_dsn).start()
    try:
        r = mover(db_dsn, "run", plan)
        assert r.returncode == 3, r.stderr  # the cutover gate
        code, before = parity(db_dsn)
        assert code == 0 and before["equal"], [d for c in before["comparisons"] for d in c["differences"]
                                               if d["status"] != "planned"]
        kinds = {d["kind"]: d["status"] for c in before["comparisons"] for d in c["differences"]}
        # Planned before the swap: the type change, and what the swap itself makes.
        assert kinds["column_type"] == "planned" and kinds["publication"] == "planned", kinds

        r = mover(db_dsn, "cutover", "parity")
        assert r.returncode == 0, r.stderr
        code, after = parity(db_dsn)
        assert code == 0 and after["swapped"] and after["comparisons"][0]["mode"] == "after_swap", after
        new = metadata(db_dsn, "Orders")
        assert new["publications"] == EXPECTED["publications"]
        assert new["statistics"] == EXPECTED["statistics"]
        assert new["columns"] == EXPECTED["columns"]
        assert new["public_select"] and new["identity"][0] == "i"
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            # the replica identity index of the live table is the key's, whatever its name
            assert conn.execute("SELECT i.indisprimary FROM pg_index i WHERE i.indrelid = '\"Orders\"'::regclass"
                                " AND i.indisreplident").fetchone() == (True,)
        # The old table left the publication: subscribers do not see the reverse replay twice.
        assert metadata(db_dsn, "Orders_old")["publications"] == []

        r = mover(db_dsn, "rollback", "parity")
        assert r.returncode == 0, r.stderr
        code, back = parity(db_dsn)
        assert code == 0, back
        assert [c["mode"] for c in back["comparisons"]] == ["before_swap", "after_rollback"]
        assert metadata(db_dsn, "Orders") == EXPECTED
        assert metadata(db_dsn, "Orders_new")["publications"] == []
        writer.pause()
        r = mover(db_dsn, "run", "parity")
        assert r.returncode == 3, r.stderr
        assert_oracle(db_dsn, "Orders", "Orders_new")
    finally:
        writer.halt()
    assert writer.errors == []


def test_unplanned_difference_refuses_cutover_until_accepted(db_dsn, tmp_path):
    create_orders(db_dsn, 2_000)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute('GRANT SELECT ON "Orders" TO PUBLIC')
    plan = parity_plan(tmp_path)
    r = mover(db_dsn, "run", plan)
    assert r.returncode == 3, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute('REVOKE SELECT ON "Orders_new" FROM PUBLIC')  # DDL on the new table, behind mover's back
    code, report = parity(db_dsn)
    assert code == 3 and not report["equal"]
    unplanned = [d["key"] for c in report["comparisons"] for d in c["differences"] if d["status"] == "unplanned"]
    assert unplanned == ["grant:SELECT TO PUBLIC"]

    r = mover(db_dsn, "cutover", "parity")
    assert r.returncode == 3, r.stderr
    assert "grant:SELECT TO PUBLIC" in r.stderr and "next:" in r.stderr and "accept_parity" in r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:  # nothing was swapped
        assert conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                            " WHERE attrelid = '\"Orders\"'::regclass AND attname = 'id'").fetchone() == ("integer",)
        assert conn.execute("SELECT has_table_privilege('public', '\"Orders\"', 'SELECT')").fetchone() == (True,)

    # The operator's decision, recorded in the plan, lets exactly that difference through.
    plan = parity_plan(tmp_path, ["grant:SELECT TO PUBLIC"])
    assert mover(db_dsn, "run", plan).returncode == 3
    r = mover(db_dsn, "cutover", "parity")
    assert r.returncode == 0, r.stderr
    code, report = parity(db_dsn)
    assert code == 0 and [d["status"] for c in report["comparisons"] for d in c["differences"]
                          if d["kind"] == "grant"] == ["accepted"]
    assert_oracle(db_dsn, "Orders")
    # After retire the old table is gone; the baseline the swap stored still answers.
    assert mover(db_dsn, "retire", "parity", "--force").returncode == 0
    code, report = parity(db_dsn)
    assert code == 0 and report["comparisons"][0]["mode"] == "after_swap"


def test_swap_back_checks_parity_too(db_dsn, tmp_path):
    """In the window someone changes the old table; the rollback would hand the application a table
    that differs from the one it uses, so it refuses (exit 3) naming `mover rollback`."""
    create_orders(db_dsn, 1_000)
    plan = parity_plan(tmp_path)
    assert mover(db_dsn, "run", plan).returncode == 3
    r = mover(db_dsn, "cutover", "parity")
    assert r.returncode == 0, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute('''COMMENT ON TABLE "Orders_old" IS 'changed in the window' ''')
    r = mover(db_dsn, "rollback", "parity")
    assert r.returncode == 3, r.stderr
    said = " ".join(r.stderr.split())  # the console wraps long lines
    assert '"comment:table"' in said and "`mover rollback parity`" in said
    with psycopg.connect(db_dsn, autocommit=True) as conn:  # nothing was swapped back
        assert conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                            " WHERE attrelid = '\"Orders\"'::regclass AND attname = 'id'").fetchone() == ("bigint",)
        conn.execute('COMMENT ON TABLE "Orders_old" IS NULL')
    r = mover(db_dsn, "rollback", "parity")
    assert r.returncode == 0, r.stderr
    assert_oracle(db_dsn, "Orders", "Orders_new")


SWAPPED_OBJECTS = """
CREATE TABLE customers_ref (id bigint PRIMARY KEY, order_id integer REFERENCES "Orders" (id) ON DELETE CASCADE);
ALTER TABLE "Orders" ADD CONSTRAINT orders_note_key UNIQUE (note);
CREATE FUNCTION orders_touch() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$;
CREATE TRIGGER orders_touch BEFORE UPDATE ON "Orders" FOR EACH ROW EXECUTE FUNCTION orders_touch();
ALTER TABLE "Orders" ENABLE ROW LEVEL SECURITY;
CREATE POLICY orders_all ON "Orders" USING (true);
CREATE VIEW orders_paid AS SELECT id, amount FROM "Orders" WHERE status = 'paid';
"""


def test_what_the_swap_moves_is_compared_too(db_dsn, tmp_path):
    """Triggers, policies, views, inbound foreign keys and a unique constraint (moved by the swap,
    mover/engines/swap/carry.py) are part of the comparison: the swap's own check passes, and so does
    `mover parity` after the swap and after the rollback, with no name left different."""
    create_orders(db_dsn, 1_000)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute('UPDATE "Orders" SET note = id::text')
        conn.execute(SWAPPED_OBJECTS)
    assert mover(db_dsn, "run", parity_plan(tmp_path)).returncode == 3
    code, before = parity(db_dsn)
    made = {d["kind"] for d in before["comparisons"][0]["differences"] if d["reason"] == "made at the swap"}
    assert code == 0 and {"trigger", "policy", "view", "referenced_by", "row_security"} <= made, before
    r = mover(db_dsn, "cutover", "parity")
    assert r.returncode == 0, r.stderr
    code, after = parity(db_dsn)
    assert code == 0, after
    kinds = {d["kind"] for c in after["comparisons"] for d in c["differences"] if d["status"] != "planned"}
    assert kinds == set(), kinds
    planned = {d["kind"] for c in after["comparisons"] for d in c["differences"]}
    assert planned <= {"column_type", "constraint_validated"}, planned  # no index or constraint name differs
    r = mover(db_dsn, "rollback", "parity")
    assert r.returncode == 0, r.stderr
    code, back = parity(db_dsn)
    assert code == 0 and back["comparisons"][-1]["mode"] == "after_rollback"
    assert [d for d in back["comparisons"][-1]["differences"] if d["status"] != "planned"] == []


def test_a_change_between_preparation_and_lock_is_caught_under_the_lock(db_dsn, tmp_path):
    """The live table's parity description is read before the lock with the swap's statements; a
    grant and a column comment added to it after that (while mover waits at the last point before
    the lock) change the digest checked under the lock, so it is read again there and the new table,
    which lacks them, is refused (exit 3) rather than swapped in without them."""
    create_orders(db_dsn, 1_000)
    assert mover(db_dsn, "run", parity_plan(tmp_path)).returncode == 3
    code, err = cutover_with_change_before_lock(db_dsn, "parity", tmp_path, 'GRANT SELECT ON "Orders" TO PUBLIC',
                                                """COMMENT ON COLUMN "Orders".note IS 'late'""")
    assert code == 3, err
    said = " ".join(err.split())
    assert "grant:SELECT TO PUBLIC" in said and "column_comment:note" in said, said
    with psycopg.connect(db_dsn, autocommit=True) as conn:  # nothing was swapped
        assert conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                            " WHERE attrelid = '\"Orders\"'::regclass AND attname = 'id'").fetchone() == ("integer",)
        # the operator gives the new table the same, and the cutover goes through with them
        conn.execute('GRANT SELECT ON "Orders_new" TO PUBLIC')
        conn.execute("""COMMENT ON COLUMN "Orders_new".note IS 'late'""")
    r = mover(db_dsn, "cutover", "parity")
    assert r.returncode == 0, r.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT has_table_privilege('public', attrelid, 'SELECT'), col_description(attrelid,"
                            " attnum) FROM pg_attribute WHERE attrelid = '\"Orders\"'::regclass"
                            " AND attname = 'note'").fetchone() == (True, "late")
    assert_oracle(db_dsn, "Orders")


def test_a_shape_change_between_preparation_and_lock_is_caught_under_the_lock(db_dsn, tmp_path):
    """The shapes are checked before the lock and, under it, through the digest: a column default
    changed or an index created on the source in between is refused (exit 2), nothing swapped."""
    create_orders(db_dsn, 1_000)
    assert mover(db_dsn, "run", parity_plan(tmp_path)).returncode == 3
    for change, named in (("""ALTER TABLE "Orders" ALTER status SET DEFAULT 'late'""", "status"),
                          ('CREATE INDEX orders_late ON "Orders" (note)', "orders_late")):
        code, err = cutover_with_change_before_lock(db_dsn, "parity", tmp_path, change)
        assert code == 2 and named in err, err
        with psycopg.connect(db_dsn, autocommit=True) as conn:  # nothing was swapped
            assert conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid ="
                                " '\"Orders\"'::regclass AND attname = 'id'").fetchone() == ("integer",)
            # undone, so the next change is the only one
            conn.execute("ALTER TABLE \"Orders\" ALTER status DROP DEFAULT; DROP INDEX IF EXISTS orders_late")
        (tmp_path / "release").unlink()
    assert mover(db_dsn, "cutover", "parity").returncode == 0
    assert_oracle(db_dsn, "Orders")


def test_a_security_label_without_its_provider_is_reported_not_carried(db_dsn, tmp_path):
    """No label provider exists on the test servers (dummy_seclabel is only in PostgreSQL's source
    tree): a label is written into pg_seclabel directly, as a provider that is not loaded would
    have left it. Plan check names it and the provider it needs, and creating the target refuses
    rather than dropping it; parity reports it as a difference. Carrying a label through a real
    provider stays untested (docs/operating.md)."""
    create_orders(db_dsn, 100)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SET allow_system_table_mods = on")
        conn.execute("""INSERT INTO pg_seclabel VALUES ('"Orders"'::regclass, 'pg_class'::regclass, 0,"""
                     " 'absent_provider', 'secret')")
    plan = parity_plan(tmp_path)
    for command in (("plan", "check", plan), ("run", plan)):
        r = mover(db_dsn, *command)
        said = " ".join(r.stderr.split())
        assert r.returncode == 2 and 'security label provider "absent_provider" is not loaded' in said, said
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('\"Orders_new\"')").fetchone() == (None,)  # nothing created
        conn.execute('CREATE TABLE orders_unlabelled (LIKE "Orders")')
        with conn.cursor() as cur:
            labelled = mover_parity.describe(cur, cur.execute("SELECT '\"Orders\"'::regclass::oid").fetchone()[0])
            plain = mover_parity.describe(cur, cur.execute("SELECT 'orders_unlabelled'::regclass::oid").fetchone()[0])
    assert labelled is not None and plain is not None
    assert labelled["metadata"]["security_labels"] == {"absent_provider": "secret"}
    found = [d for d in mover_parity.compare(labelled, plain, mover_parity.Planned()) if d.kind == "security_labels"]
    assert [(d.key, d.status) for d in found] == [("security_labels:table", "unplanned")]
