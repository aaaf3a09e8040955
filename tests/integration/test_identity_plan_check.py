"""Plan check refuses every object bound to the source's identity (its oid or row type) that the swap
would leave on the old table (invariant 15, mover/catalog/identity.py): exit 2, each object named as
PostgreSQL describes it with the statement that fixes it, and nothing changed. All of them in one
run; what the swap carries (a view, a materialized view, statistics, a foreign key) is not refused."""

from __future__ import annotations

from tests.integration.test_plan_check import assert_bad, db, execute, mover, plan_toml, snapshot, write_plan

__all__ = ["db"]  # the fixture, imported for the tests below

BOUND = """
CREATE TABLE audit (r orders);
CREATE DOMAIN order_row AS orders;
CREATE TABLE batches (o orders[], d order_row);
CREATE TYPE order_pair AS (a orders, b orders);
CREATE FUNCTION order_count() RETURNS bigint LANGUAGE sql BEGIN ATOMIC SELECT count(*) FROM orders; END;
CREATE FUNCTION all_orders() RETURNS SETOF orders LANGUAGE sql AS 'SELECT * FROM orders';
CREATE TABLE shown (id int);
CREATE POLICY by_order ON shown USING (id IN (SELECT id FROM orders));
CREATE RULE touch AS ON INSERT TO shown DO ALSO UPDATE orders SET total = total WHERE id = NEW.id;
CREATE TABLE "Archived Orders" () INHERITS (orders);
CREATE TABLE reporting (id int);
ALTER TABLE orders INHERIT reporting;
CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';
CREATE CONSTRAINT TRIGGER "Order Watch" AFTER INSERT ON shown FROM orders FOR EACH ROW EXECUTE FUNCTION noop();
CREATE CAST (orders AS int) WITH INOUT;
-- carried, not refused:
CREATE VIEW big AS SELECT * FROM orders WHERE total > 10;
CREATE MATERIALIZED VIEW per_customer AS SELECT customer, count(*) FROM orders GROUP BY 1;
CREATE STATISTICS orders_stats ON customer, total FROM orders;
CREATE TABLE lines (id int PRIMARY KEY, order_id int REFERENCES orders);
"""


def test_every_object_bound_to_the_identity_is_refused_by_name_with_its_fix(db, tmp_path):
    execute(db, BOUND)
    path = write_plan(tmp_path, plan_toml(columns={"id": "bigint"}))
    before = snapshot(db)
    r = mover(db, "plan", "check", str(path))
    assert_bad(r, [
        'ALTER TABLE "public"."audit" ALTER COLUMN "r" TYPE jsonb', 'ALTER TABLE "public"."audit" DROP COLUMN "r"',
        "type public.order_row", 'DROP DOMAIN "public"."order_row"',
        "column o of table public.batches", "column d of table public.batches",
        'ALTER TYPE "public"."order_pair" DROP ATTRIBUTE "a"',
        "function public.order_count()", "AS $$",
        'DROP FUNCTION "public"."all_orders"()',
        'DROP POLICY "by_order" ON "public"."shown"',
        'DROP RULE "touch" ON "public"."shown"',
        'ALTER TABLE "public"."Archived Orders" NO INHERIT "public"."orders"',
        'ALTER TABLE "public"."orders" NO INHERIT "public"."reporting"',
        # an automatic dependency of another table's object (it would go with the old table silently)
        'DROP TRIGGER "Order Watch" ON "public"."shown"',
        # a kind mover has no statement for: named by PostgreSQL's description of it
        "cast from public.orders to integer",
    ])
    message = " ".join(r.stderr.split())
    for carried in ("big", "per_customer", "orders_stats", "lines_order_id_fkey"):
        assert carried not in message, message
    assert snapshot(db) == before
