"""What the swap cannot carry over, refused rather than lost at the cutover: a typed table or a
partition (inheritance, and everything else bound to the table's oid or row type:
mover/checks/identity.py), and an
exclusion constraint (or a temporal key, one underneath) on a partitioned target where PostgreSQL
takes none. (Triggers, rules, row-level security, dependent views and foreign keys are carried
over: mover/engines/swap/carry.py; exclusion constraints and temporal keys are built on the new table
after the copy: mover/engines/bulk/builds.py.)"""

from __future__ import annotations

from mover import names
from mover.catalog import introspect, server
from mover.checks.subject import Subject
from mover.errors import PlanError


def exclusion_constraints(s: Subject) -> None:
    """An exclusion constraint goes to the new table as it is (its name kept through the swap);
    a partitioned one takes it only where PostgreSQL allows it. So does a temporal key
    (PostgreSQL 18: PRIMARY KEY / UNIQUE (..., col WITHOUT OVERLAPS)), whose operators are `=` on
    its plain columns and `&&` on its period: a partitioned table takes it when it is partitioned
    by plain columns of the key. The DDL rehearsal then tries each on the rehearsed target
    (checks/rehearsal.py)."""
    spec = s.plan.new_layout
    excluding = [ix for ix in s.table.indexes if ix.by_constraint]
    if spec is None or not excluding:
        return
    srv = server.of(s.cur)
    for ix in excluding:
        what = f"{s.src} has the {ix.constraint_kind} {names.display_ident(ix.name)} ({ix.constraint_def})"
        if not srv.exclusion_on_partitioned:
            s.report(PlanError(
                f"[target.partition]: {what}, and PostgreSQL {srv.major} takes no exclusion constraint on a"
                f" partitioned table (17 and later do, when it compares every partition column with =)",
                hint="keep the table unpartitioned in this plan, or convert it on PostgreSQL 17 or later"))
            continue
        s.cur.execute(
            "SELECT a.attname FROM pg_index i"
            " CROSS JOIN LATERAL unnest((i.indkey::int2[])[0:i.indnkeyatts - 1], %s::oid[]) AS x(attnum, op)"
            " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = x.attnum"
            " JOIN pg_operator o ON o.oid = x.op WHERE i.indexrelid = %s AND o.oprname = '='",
            (_operators(s, ix), ix.oid))
        equal = {r[0] for r in s.cur.fetchall()}
        missing = [c for c in spec.columns if c not in equal]
        if not missing:
            continue
        columns = f"column{'s' if len(missing) > 1 else ''} {', '.join(map(names.display_ident, missing))}"
        if ix.constraint_kind == "temporal key":
            s.report(PlanError(
                f"[target.partition]: {what}, which does not hold the partition {columns} among its plain"
                f" (non-period) columns; PostgreSQL takes a temporal key on a partitioned table only when it"
                f" does (two rows it excludes must fall in one partition)",
                hint="partition by columns the key holds before its WITHOUT OVERLAPS column"))
            continue
        s.report(PlanError(
            f"[target.partition]: {what}, which does not compare the partition {columns} with =;"
            f" PostgreSQL takes an exclusion constraint on a partitioned table only when it does (two rows it"
            f" excludes must fall in one partition)",
            hint=f"partition by columns the constraint compares with =, or add "
                 f"{', '.join(f'{names.display_ident(c)} WITH =' for c in missing)} to the constraint first"))


def _operators(s: Subject, ix: introspect.Index) -> list[int]:
    s.cur.execute("SELECT conexclop::oid[] FROM pg_constraint WHERE conindid = %s AND conexclop IS NOT NULL",
                  (ix.oid,))
    row = s.cur.fetchone()
    return list(row[0]) if row else []


def table_properties(s: Subject) -> None:
    meta = introspect.metadata(s.cur, s.table.oid)
    # Plain inheritance, either way, is named with its fix by checks/identity.py.
    if meta.inheritance and meta.inheritance not in ("inherits from another table", "has inheritance children"):
        raise PlanError(f"[migration] source: {s.src} {meta.inheritance}: not supported yet",
                        hint="mover refuses rather than lose this at the swap; see docs/operating.md,"
                             " \"Known limitations\"")
