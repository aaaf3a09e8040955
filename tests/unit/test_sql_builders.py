"""The SQL builders rendered without a server: psycopg 3 quotes an Identifier without a
connection (`as_string(None)`), so each builder's text is checked as PostgreSQL will receive it,
with names that need quoting (spaces, capitals, quotes) to show nothing is pasted in raw."""

from __future__ import annotations

from psycopg import sql

from mover.catalog.introspect import Index
from mover.engines.swap import lockwatch
from mover.names import QualifiedName
from mover.sql import capture, casts, compare, copy, ddl, mapping
from mover.sql.mapping import MappedColumn, Mapping

SRC = QualifiedName("Sales", "Order Items")
DST = QualifiedName("Sales", "Order Items_new")


def text(q: sql.Composable) -> str:
    return q.as_string(None)


def test_identifiers_are_quoted_without_a_connection():
    assert text(sql.Identifier('we"ird', "t")) == '"we""ird"."t"'
    assert text(QualifiedName(None, "Orders").ident) == '"Orders"'


def test_create_target_takes_everything_but_indexes_triggers_and_foreign_keys():
    assert text(ddl.create_target(DST, SRC)) == (
        'CREATE TABLE "Sales"."Order Items_new" (LIKE "Sales"."Order Items" INCLUDING DEFAULTS INCLUDING CONSTRAINTS'
        " INCLUDING GENERATED INCLUDING IDENTITY INCLUDING STORAGE INCLUDING COMMENTS INCLUDING COMPRESSION)")
    unlogged = text(ddl.create_target(DST, SRC, unlogged=True))
    assert unlogged.startswith('CREATE UNLOGGED TABLE "Sales"."Order Items_new"')


def test_alter_column_type_with_and_without_a_collation():
    assert text(ddl.alter_column_type(DST, "Item ID", "bigint")) == (
        'ALTER TABLE "Sales"."Order Items_new" ALTER COLUMN "Item ID" TYPE bigint')
    assert text(ddl.alter_column_type(DST, "name", "varchar(20)", ("pg_catalog", "C"))) == (
        'ALTER TABLE "Sales"."Order Items_new" ALTER COLUMN "name" TYPE varchar(20) COLLATE "pg_catalog"."C"')


def test_create_index_keeps_the_catalog_tail():
    ix = Index(oid=1, name="ix", is_primary=False, is_unique=True, is_valid=True, is_exclusion=False,
               definition_tail='USING btree ("Qty") WHERE ("Qty" > 0)')
    assert text(ddl.create_index("Order Items_new_qty", DST, ix, concurrently=True)) == (
        'CREATE UNIQUE INDEX CONCURRENTLY "Order Items_new_qty" ON "Sales"."Order Items_new"'
        ' USING btree ("Qty") WHERE ("Qty" > 0)')
    plain = Index(oid=1, name="ix", is_primary=False, is_unique=False, is_valid=True, is_exclusion=False,
                  definition_tail="USING btree (a)")
    assert text(ddl.create_index("i", DST, plain, concurrently=False)) == (
        'CREATE INDEX "i" ON "Sales"."Order Items_new" USING btree (a)')


def test_swap_statements():
    assert text(lockwatch.lock_sql(SRC)) == 'LOCK TABLE "Sales"."Order Items" IN ACCESS EXCLUSIVE MODE'
    assert text(ddl.rename_table(SRC, "Order Items_old")) == (
        'ALTER TABLE "Sales"."Order Items" RENAME TO "Order Items_old"')
    assert text(ddl.add_primary_key_using(DST, "Order Items_pkey", "Order Items_new_pkey")) == (
        'ALTER TABLE "Sales"."Order Items_new" ADD CONSTRAINT "Order Items_pkey"'
        ' PRIMARY KEY USING INDEX "Order Items_new_pkey"')
    assert text(ddl.drop_table(DST)) == 'DROP TABLE IF EXISTS "Sales"."Order Items_new"'
    assert text(ddl.drop_index("Sales", "ix")) == 'DROP INDEX IF EXISTS "Sales"."ix"'
    assert text(ddl.drop_constraint(DST, "c")) == 'ALTER TABLE "Sales"."Order Items_new" DROP CONSTRAINT "c"'


def test_capture_function_body_resolves_nothing_through_the_search_path():
    """Issue 20: the SECURITY DEFINER body names every operator and function with its schema (a
    CREATE on public must not put code of another role into it); no SET clause, EXECUTE revoked."""
    import re

    function, log = QualifiedName("mover", "m1_capture"), QualifiedName("mover", "m1_changes")
    create, revoke = (text(s) for s in capture.create_trigger_function(function, log, ("k", "Part"), "m",
                                                                        ("pg_catalog", "ext")))
    assert create.startswith('CREATE OR REPLACE FUNCTION "mover"."m1_capture"() RETURNS trigger LANGUAGE plpgsql'
                             ' SECURITY DEFINER AS ') and " SET " not in create.split(" AS ")[0]
    assert revoke == 'REVOKE ALL ON FUNCTION "mover"."m1_capture"() FROM PUBLIC'
    body = create.split(" AS ", 1)[1]
    assert 'OLD."k" OPERATOR("pg_catalog".=) NEW."k"' in body and 'OLD."Part" OPERATOR("ext".=) NEW."Part"' in body
    assert 'INSERT INTO "mover"."m1_changes"' in body and "IS DISTINCT FROM" not in body
    # Left once the qualified operators, RAISE's USING options and the string literals are gone:
    # no operator symbol, and every function call is pg_catalog's.
    bare = re.sub(r"OPERATOR\([^)]*\)|''[^']*''|(ERRCODE|MESSAGE|HINT) =", " ", body)
    assert not re.search(r"[=<>!~+*/|&^%#@-]", bare.replace("--", " ")), bare
    calls = re.findall(r"([\w.\"]+)\s*\(", bare)
    assert set(calls) <= {"pg_catalog.format", "NOT", "VALUES", '"mover"."m1_changes"'}, calls


def test_capture_triggers_fire_always_and_on_truncate():
    function = QualifiedName("mover", "capture_fn_1")
    statements = [text(s) for s in capture.create_trigger("mover_capture_1", SRC, function)]
    assert statements == [
        'CREATE TRIGGER "mover_capture_1" AFTER INSERT OR UPDATE OR DELETE ON "Sales"."Order Items"'
        ' FOR EACH ROW EXECUTE FUNCTION "mover"."capture_fn_1"()',
        'CREATE TRIGGER "mover_capture_1_truncate" BEFORE TRUNCATE ON "Sales"."Order Items"'
        ' FOR EACH STATEMENT EXECUTE FUNCTION "mover"."capture_fn_1"()',
        'ALTER TABLE "Sales"."Order Items" ENABLE ALWAYS TRIGGER "mover_capture_1"',
        'ALTER TABLE "Sales"."Order Items" ENABLE ALWAYS TRIGGER "mover_capture_1_truncate"',
    ]
    assert text(capture.drop_trigger("mover_capture_1", SRC)) == (
        'DROP TRIGGER IF EXISTS "mover_capture_1" ON "Sales"."Order Items"')
    assert text(capture.drop_function(function)) == 'DROP FUNCTION IF EXISTS "mover"."capture_fn_1"()'


def _mapping(collations=()) -> Mapping:
    return Mapping(src=SRC, dst=DST, key=("Item ID", "line"), src_key_types=("integer", "text"),
                   columns=(MappedColumn("Item ID", "bigint", False), MappedColumn("line", None, False),
                            MappedColumn("Qty", None, False)),
                   overriding=True, key_collations=collations)


def test_range_predicate_bounds_are_parameters_cast_from_text():
    m = _mapping()
    where, params = mapping.range_predicate("s", m, ["10", "a"], ["20", "b"])
    assert text(where) == ('("s"."Item ID", "s"."line") > (CAST(%s AS integer), CAST(%s AS text))'
                           ' AND ("s"."Item ID", "s"."line") <= (CAST(%s AS integer), CAST(%s AS text))')
    assert params == ["10", "a", "20", "b"]
    assert mapping.range_predicate("s", m, None, None) == (sql.SQL("true"), [])


def test_range_bounds_use_the_key_collation():
    m = _mapping(collations=(None, ("pg_catalog", "C")))
    where, params = mapping.range_predicate("s", m, None, ["20", "b"])
    assert text(where) == ('("s"."Item ID", "s"."line") <= (CAST(%s AS integer), CAST(%s AS text)'
                           ' COLLATE "pg_catalog"."C")')
    assert params == ["20", "b"]


def test_copy_range_inserts_with_assignment_semantics():
    q, params = copy.copy_range(_mapping(), None, ["5", "x"])
    assert text(q) == (
        'INSERT INTO "Sales"."Order Items_new" ("Item ID", "line", "Qty") OVERRIDING SYSTEM VALUE'
        ' SELECT "s"."Item ID", "s"."line", "s"."Qty" FROM "Sales"."Order Items" s'
        ' WHERE ("s"."Item ID", "s"."line") <= (CAST(%s AS integer), CAST(%s AS text))')
    assert params == ["5", "x"]


def test_values_go_back_through_cast_only_without_an_assignment_cast_and_checked_where_they_can_change():
    """The rollback window's replay (mover/catalog/conversion.py mapping, reverse): a text column back to
    integer goes through CAST, and its value is refused where it does not come back as written; a
    varchar(10) column is converted by the INSERT (assignment: a long value fails, never cut), checked
    byte for byte; a column with no conversion at all takes only NULL."""
    cols = (MappedColumn("id", None),
            MappedColumn("Code %", "integer", "text", mapping.CAST, "collated"),
            MappedColumn("name", "character varying(10)", "text", mapping.ASSIGN, "collated"),
            MappedColumn("price", "numeric", "double precision", mapping.ASSIGN, "value"),
            MappedColumn("pay", "money", None, mapping.NONE))
    m = Mapping(src=DST, dst=SRC, key=("id",), src_key_types=("integer",), columns=cols, overriding=False)
    values = text(mapping.source_values("s", m))
    assert values.startswith('"s"."id", CASE WHEN ')
    rest = values.removeprefix('"s"."id", ')
    refused = ("CAST(CAST(CAST(%s AS pg_catalog.int4) AS pg_catalog.text) AS {})")
    shown = "pg_catalog.quote_literal(pg_catalog.left(CAST({} AS pg_catalog.text), 100))"
    code, back = '"s"."Code %"', 'CAST(CAST("s"."Code %" AS integer) AS text)'
    assert rest.startswith(
        f'CASE WHEN {code} COLLATE pg_catalog."C" IS NOT DISTINCT FROM {back}'
        f' THEN CAST({code} AS integer) ELSE ' + refused.format("integer").replace("%s", (
            "('mover: value of column \"Code ' || pg_catalog.chr(37) || '\" does not convert to integer and back"
            " unchanged: ') || " + shown.format(code) + " || ' comes back as ' || " + shown.format(back))) + " END")
    assert ('CASE WHEN "s"."name" COLLATE pg_catalog."C" IS NOT DISTINCT FROM CAST(CAST("s"."name" AS character'
            ' varying(10)) AS text) THEN "s"."name" ELSE CAST(CAST(CAST(') in rest  # the INSERT converts it
    assert ('CASE WHEN "s"."price" IS NOT DISTINCT FROM CAST(CAST("s"."price" AS numeric) AS double precision)'
            ' THEN "s"."price" ELSE') in rest
    assert rest.endswith(
        'CASE WHEN "s"."pay" IS NULL THEN CAST(NULL AS money) ELSE ' + refused.format("money").replace(
            "%s", "'mover: column \"pay\" has no conversion to money: value ' || " + shown.format('"s"."pay"'))
        + " END")
    # the % of a name is spelled chr(37): psycopg would read it as a placeholder, literal or not
    assert "%" not in text(mapping.source_values("s", m)).replace('"Code %"', "")
    # the forward direction is untouched: plain columns, the INSERT converts
    assert text(mapping.source_values("s", _mapping())) == '"s"."Item ID", "s"."line", "s"."Qty"'


def test_a_refusal_is_read_back_out_of_the_error():
    assert mapping.refusal('invalid input syntax for type integer: "mover: value of column "c" does not convert to'
                           ' integer and back unchanged: \'042\' comes back as \'42\'"') == (
        'value of column "c" does not convert to integer and back unchanged: \'042\' comes back as \'42\'')
    assert mapping.refusal('invalid input syntax for type integer: "abc"') is None


def test_the_conversion_probes():
    t = QualifiedName("mover", "cast_probe_x")
    assert text(casts.probe_table(t, ["integer", "character varying(10)"])) == (
        'CREATE TABLE "mover"."cast_probe_x" ("c_0" integer, "c_1" character varying(10))')
    assert text(casts.assignment(t, 0, 1)) == (
        'EXPLAIN INSERT INTO "mover"."cast_probe_x" ("c_1") SELECT "c_0" FROM "mover"."cast_probe_x"')
    assert text(casts.explicit(t, 1, "integer")) == 'EXPLAIN SELECT CAST("c_1" AS integer) FROM "mover"."cast_probe_x"'
    assert text(casts.comparable(t, [(0, 1), (2, 3)])) == (
        'EXPLAIN SELECT 1 FROM "mover"."cast_probe_x" WHERE ("c_0", "c_2") = ("c_1", "c_3") AND ("c_1", "c_3") ='
        ' ("c_0", "c_2") AND ("c_0", "c_2") > ("c_1", "c_3") AND ("c_1", "c_3") > ("c_0", "c_2")')


def test_next_bound_casts_to_text_outside_the_offset():
    q, params = copy.next_bound(_mapping(), ["1", "a"])
    assert text(q) == (
        'SELECT "s"."Item ID"::text, "s"."line"::text FROM (SELECT "s"."Item ID", "s"."line"'
        ' FROM "Sales"."Order Items" s WHERE ("s"."Item ID", "s"."line") > (CAST(%s AS integer), CAST(%s AS text))'
        ' ORDER BY "s"."Item ID", "s"."line" OFFSET %s LIMIT 1) s')
    assert params == ["1", "a"]


def test_fingerprint_adjusts_the_source_sum_by_the_differing_rows():
    diffs = [{"src_hash": 5, "dst_hash": 7}, {"src_hash": None, "dst_hash": 3}, {"src_hash": 4, "dst_hash": None}]
    assert compare.fingerprint(100, diffs) == (100, 100 - 5 - 4 + 7 + 3)
    assert compare.fingerprint(None, []) == (0, 0)


def test_signed64_wraps_like_a_bigint_sum():
    assert compare.signed64(2**63 - 1) == 2**63 - 1
    assert compare.signed64(2**63) == -(2**63)
    assert compare.signed64(-1) == -1
    assert compare.signed64(2**64 + 5) == 5
    assert compare.fingerprint(2**63 - 1, [{"src_hash": -1, "dst_hash": None}]) == (2**63 - 1, -(2**63))


def test_metadata_builders_quote_every_name():
    stat = QualifiedName("Sales", "Order stat")
    assert text(ddl.set_column_statistics(DST, "Qty", 500)) == (
        'ALTER TABLE "Sales"."Order Items_new" ALTER COLUMN "Qty" SET STATISTICS 500')
    assert text(ddl.set_storage(DST, "Note", "e")) == (
        'ALTER TABLE "Sales"."Order Items_new" ALTER COLUMN "Note" SET STORAGE EXTERNAL')
    assert text(ddl.set_compression(DST, "Note", "pglz")) == (
        'ALTER TABLE "Sales"."Order Items_new" ALTER COLUMN "Note" SET COMPRESSION "pglz"')
    assert text(ddl.create_statistics(stat, ["dependencies", "ndistinct"], '"Qty", status', DST)) == (
        'CREATE STATISTICS "Sales"."Order stat" (dependencies, ndistinct) ON "Qty", status'
        ' FROM "Sales"."Order Items_new"')
    assert text(ddl.rename_statistics(stat, "x y")) == 'ALTER STATISTICS "Sales"."Order stat" RENAME TO "x y"'
    assert text(ddl.security_label("selinux", DST, "it's", "Note")) == (
        'SECURITY LABEL FOR "selinux" ON COLUMN "Sales"."Order Items_new"."Note" IS \'it\'\'s\'')
    assert text(ddl.replica_identity(DST, "i", "Order pkey")) == (
        'ALTER TABLE "Sales"."Order Items_new" REPLICA IDENTITY USING INDEX "Order pkey"')
    assert text(ddl.replica_identity(DST, "f")) == 'ALTER TABLE "Sales"."Order Items_new" REPLICA IDENTITY FULL'
    assert text(ddl.publication_add("Pub", DST, ["id", "Qty"], "id > 0")) == (
        'ALTER PUBLICATION "Pub" ADD TABLE "Sales"."Order Items_new" ("id", "Qty") WHERE (id > 0)')
    assert text(ddl.publication_drop("Pub", SRC)) == 'ALTER PUBLICATION "Pub" DROP TABLE "Sales"."Order Items"'


def test_swap_partner_index_names_and_validation_are_quoted():
    from mover.engines.swap import carry
    # The key's partner is the target's key index; every other index's is its _m<ID> build name.
    assert carry.partner_index(7, DST, "Order Items_pkey", "Order Items_pkey", True) == "Order Items_new_pkey"
    assert carry.partner_index(7, DST, "by id", "by id", False) == "Order Items_new_key"
    assert carry.partner_index(7, DST, 'idx "x"', "Order Items_pkey", True) == 'idx "x"_m7'
    long = "i" * 63
    assert len(carry.partner_index(7, DST, long, "k", True).encode()) <= 63
    assert text(carry.validate_sql("Sales", "Order Lines", 'fk "1"')) == (
        'ALTER TABLE "Sales"."Order Lines" VALIDATE CONSTRAINT "fk ""1"""')


def test_key_above_reads_the_first_key_index_entry_above_the_bound():
    q, params = copy.key_above(_mapping(), ["7", "b"])
    assert text(q) == (
        'SELECT 1 FROM "Sales"."Order Items" s'
        ' WHERE ("s"."Item ID", "s"."line") > (CAST(%s AS integer), CAST(%s AS text))'
        ' ORDER BY "s"."Item ID", "s"."line" LIMIT 1')
    assert params == ["7", "b"]
