"""The query rehearsal: the application's statements on the source that pg_stat_statements
recorded most (by calls, and by total time), planned against the target as if it already carried
the source's name, after an ANALYZE of the target; a statement whose plan gets markedly worse (an
index scan that becomes a sequential scan, an estimated cost several times higher) or that no
longer plans is found before the swap, not after it. `mover rehearse NAME`, and the cutover's
preflight with `[cutover] rehearse = true` (before_cutover: the swap is refused, exit 3).
Not the plan check's DDL rehearsal (mover/checks/rehearsal.py), which creates the target in a
savepoint.

Invariants:
- Nothing is executed. A statement is EXPLAINed, never with ANALYZE, and only if it reads as
  one statement that a planner plans (mover/sql/statement_text.py, lexing as the server does:
  SELECT, INSERT, UPDATE, DELETE, MERGE, WITH, VALUES, TABLE); before 16 it is PREPAREd by the
  extended protocol, which refuses a second statement whatever the text.
  Everything a rehearsal does in a statement's transaction is rolled back (a savepoint with
  force_rollback): the temporary view, the role it plans as, the settings, and the source's lock
  with them. Before PostgreSQL 16 a generic plan needs PREPARE, which a rollback does not undo:
  deallocated in the same transaction. What stays is the target's fresh statistics (ANALYZE).
- No lock the application queues behind (invariant 3). The source is never renamed, altered or
  explicitly locked: the target is reached through a temporary view that carries the source's
  name (the temporary schema is searched first for relation names; a `schema.source` reference in
  the text is pointed at pg_temp), so the only locks the rehearsal takes on the source are those
  the application's own statement takes to be planned (ACCESS SHARE; ROW EXCLUSIVE for a write),
  which never conflict with the application's reads and writes. Each statement is planned in a
  transaction of its own that ends at once, the source's EXPLAIN last (so its lock is held for one
  planning), under `[cutover] lock_timeout`: behind a DDL waiting for the source it gives up
  rather than make the queue longer, and the statement is reported as not rehearsed.
- No other role's code runs with mover's rights (invariant 11). Planning can run functions (an
  immutable one over constants is folded), so a statement is planned as the role that ran it
  (SET LOCAL ROLE, under that role's search_path), or as mover's role when that role already has
  mover's rights; otherwise it is not planned, and the report says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from mover import faults
from mover.catalog import introspect
from mover.db import Database, bind, is_connection_lost, is_retryable, one
from mover.engines.context import Context
from mover.engines.swap import carry
from mover.errors import BadInput, Waiting
from mover.names import QualifiedName, display_ident
from mover.plan import Plan
from mover.sql import explain as explain_sql
from mover.sql import statement_text
from mover.state import control

T = TypeVar("T")

# What one statement's planning may take (planning only: a statement is never executed).
PLAN_TIMEOUT = "10s"
ATTEMPTS = 3  # a lock not granted within lock_timeout: the statement's transaction is tried again

# Verdicts. The first three are marked: `mover rehearse` exits 3, the cutover's preflight refuses.
SEQ_SCAN = "seq_scan"  # a sequential scan of the target where the source's plan used an index
COST_UP = "cost_up"  # the estimated cost rose by [cutover] rehearse_cost_factor or more
FAILS = "fails"  # plans on the source, not on the target
CHANGED = "changed"  # another plan, not markedly worse
SAME = "same"
SKIPPED = "skipped"  # not rehearsed (the note says why)
MARKED = (SEQ_SCAN, FAILS, COST_UP)


class StatementsUnavailable(BadInput):
    """pg_stat_statements is not there to read (exit 2): the rehearsal plans what it recorded."""


def generic_plan_option(cur: psycopg.Cursor) -> bool:
    """Whether EXPLAIN takes GENERIC_PLAN (PostgreSQL 16 on); before, a statement is PREPAREd and
    EXPLAIN EXECUTEd under plan_cache_mode = force_generic_plan, which plans the same. The one
    place the rehearsal differs by server version (mover/catalog/server.py takes it over when the
    server-capabilities module lands)."""
    return cur.connection.info.server_version >= 160000


@dataclass(frozen=True)
class Settings:
    statements: int = 20  # per table: the top N by calls, and the top N by total time
    cost_factor: int = 2  # an estimated cost this many times the source's is marked
    lock_timeout_ms: int = 200
    analyze: bool = True  # ANALYZE the target first
    prepared: bool | None = None  # None: by the server's version; True/False: that way (the tests' both ways)

    @classmethod
    def of(cls, plan: Plan, top: int | None = None) -> Settings:
        c = plan.cutover
        return cls(statements=top or c.rehearse_statements, cost_factor=c.rehearse_cost_factor,
                   lock_timeout_ms=c.lock_timeout_ms)


@dataclass(frozen=True)
class Pair:
    """One table of the migration: the source the application names, the target that will carry
    its name, and the names the swap gives the target's indexes (target name -> source name)."""
    source: QualifiedName
    target: QualifiedName
    index_names: Mapping[str, str] = field(default_factory=dict, compare=False)  # a pair is its two tables

    @classmethod
    def of(cls, cur: psycopg.Cursor, m: control.Migration) -> Pair:
        """The migration's table, with the index names the swap hands over (carry.partner_index)."""
        oid = introspect.table_oid(cur, m.source)
        if oid is None:
            raise BadInput(f"the source {m.source} of migration {m.name!r} does not exist",
                           hint=f"`mover status {m.name}` shows where the migration stands")
        key_index = introspect.key_index(cur, oid, m.source)
        cur.execute("SELECT ic.relname, i.indisprimary FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid"
                    " WHERE i.indrelid = %s", (oid,))
        names = {carry.partner_index(m.id, m.target, ix, key_index, primary): ix for ix, primary in cur.fetchall()}
        return cls(m.source, m.target, names)


@dataclass(frozen=True)
class Recorded:
    """A statement as pg_stat_statements recorded it, summed over its entries for one role."""
    role: str | None
    text: str
    calls: int
    total_ms: float


@dataclass(frozen=True)
class Scan:
    node: str  # EXPLAIN's node type: "Seq Scan", "Index Scan", "Bitmap Index Scan", ...
    relation: str | None
    index: str | None


@dataclass(frozen=True)
class PlanShape:
    """What the comparison looks at in one plan: its estimated total cost, its nodes top down
    (as EXPLAIN names them, with the index and relation each uses), and the scans of the migrated
    table (or its partitions), index names as the swap leaves them."""
    cost: float
    nodes: tuple[str, ...]
    scans: tuple[Scan, ...]

    @property
    def seq_scans(self) -> int:
        return sum(1 for s in self.scans if s.node == "Seq Scan")

    @property
    def index_scans(self) -> int:
        return sum(1 for s in self.scans if s.index is not None)

    @property
    def indexes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.index for s in self.scans if s.index is not None))

    def as_dict(self) -> dict[str, Any]:
        return {"cost": self.cost, "plan": list(self.nodes), "indexes": list(self.indexes),
                "scans": [{"node": s.node, "relation": s.relation, "index": s.index} for s in self.scans]}


@dataclass(frozen=True)
class Finding:
    """One statement rehearsed: both plans, and the verdict."""
    statement: Recorded
    verdict: str
    before: PlanShape | None = None
    after: PlanShape | None = None
    error: str | None = None  # why it does not plan on the target (FAILS)
    note: str | None = None  # why it was not rehearsed (SKIPPED), or what to know about the verdict

    @property
    def marked(self) -> bool:
        return self.verdict in MARKED

    @property
    def factor(self) -> float | None:
        if self.before is None or self.after is None:
            return None
        return cost_factor(self.before.cost, self.after.cost)

    def as_dict(self) -> dict[str, Any]:
        factor = self.factor
        return {"verdict": self.verdict, "marked": self.marked, "role": self.statement.role,
                "calls": self.statement.calls, "total_ms": round(self.statement.total_ms, 3),
                "statement": self.statement.text,
                "before": self.before.as_dict() if self.before else None,
                "after": self.after.as_dict() if self.after else None,
                "cost_factor": None if factor is None or math.isinf(factor) else round(factor, 2),
                "error": self.error, "note": self.note}


@dataclass
class TableRehearsal:
    """The rehearsal of one table: what was considered, what was planned, what changed."""
    pair: Pair
    findings: list[Finding] = field(default_factory=list)
    considered: int = 0  # recorded statements that name the source (mover's own left out)
    hidden: int = 0  # statements of this database mover's role may not read
    analyzed: bool = False
    analyze_note: str | None = None

    @property
    def marked(self) -> list[Finding]:
        return [f for f in self.findings if f.marked]

    def as_dict(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for f in self.findings:
            counts[f.verdict] = counts.get(f.verdict, 0) + 1
        return {"source": str(self.pair.source), "target": str(self.pair.target), "analyzed": self.analyzed,
                "analyze_note": self.analyze_note, "considered": self.considered, "rehearsed": len(self.findings),
                "hidden": self.hidden, "verdicts": counts, "marked": len(self.marked),
                "statements": [f.as_dict() for f in self.findings]}


def cost_factor(before: float, after: float) -> float:
    if before > 0:
        return after / before
    return 1.0 if after <= 0 else math.inf


# ---------------------------------------------------------------------------------------------
# pg_stat_statements


def statements_view(db: Database) -> QualifiedName:
    """The pg_stat_statements view of this database, readable; StatementsUnavailable (exit 2)
    saying how to enable it otherwise."""
    def find(cur: psycopg.Cursor) -> tuple[str | None, str | None, bool, str]:
        # shared_preload_libraries from pg_settings: a role without pg_read_all_settings gets no row
        # (current_setting would raise), and the view itself says whether the library is loaded.
        cur.execute("SELECT (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
                    "        WHERE e.extname = 'pg_stat_statements'),"
                    " (SELECT setting FROM pg_settings WHERE name = 'shared_preload_libraries'),"
                    " EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_stat_statements'),"
                    " current_database()")
        schema, preload, available, dbname = one(cur)
        return schema, preload, available, dbname

    schema, preload, available, dbname = db.transaction(find, label="pg_stat_statements")
    # None: not known (the setting is hidden from mover's role).
    loaded = None if preload is None else "pg_stat_statements" in [p.strip().strip('"') for p in preload.split(",")]
    preload_step = "add pg_stat_statements to shared_preload_libraries in postgresql.conf and restart the server"
    steps = ([] if available else ["install the server's contrib package (it ships pg_stat_statements)"]) + \
        ([] if loaded else [preload_step if loaded is False else f"if it is not there yet, {preload_step}"]) + \
        ([] if schema else [f"run `CREATE EXTENSION pg_stat_statements` in database {display_ident(dbname)}"]) + \
        ["let the application run a while (the rehearsal plans the statements it recorded), then run the same "
         "command again"]
    if schema is None or loaded is False:
        why = "is not loaded by this server" if loaded is False else "is not installed in this database"
        raise StatementsUnavailable(f"pg_stat_statements {why}: the query rehearsal plans the statements it records",
                                    hint="; ".join(steps))
    view = QualifiedName(schema, "pg_stat_statements")
    try:
        db.transaction(lambda cur: cur.execute(sql.SQL("SELECT 1 FROM {} LIMIT 1").format(view.ident)),
                       label="pg_stat_statements")
    except psycopg.errors.ObjectNotInPrerequisiteState as exc:  # created, but not loaded (55000)
        raise StatementsUnavailable(f"pg_stat_statements cannot be read: {str(exc).strip().splitlines()[0]}",
                                    hint="; ".join([preload_step, *steps[-1:]])) from exc
    return view


def recorded(db: Database, view: QualifiedName, pair: Pair, limit: int) -> tuple[list[Recorded], int, int]:
    """The statements to rehearse for `pair`: those pg_stat_statements recorded in this database
    that name the source as an identifier, that a planner plans, and that are not mover's own (they
    name the target, or mover's schema); the `limit` most called and the `limit` that took most
    time, most called first. Also how many named the source, and how many were hidden."""
    def read(cur: psycopg.Cursor) -> tuple[list[tuple[Any, ...]], int]:
        cur.execute(explain_sql.recorded(view), {"needle": pair.source.name})
        rows = cur.fetchall()
        cur.execute(explain_sql.hidden(view))
        return rows, int(one(cur)[0])

    rows, hidden = db.transaction(read, label="pg_stat_statements")
    found: list[Recorded] = []
    for role, text, calls, total in rows:
        try:
            st = statement_text.read(text)
        except statement_text.Unreadable:
            continue
        if not st.plannable or not st.mentions(pair.source.name):
            continue
        if st.mentions(pair.target.name) or st.qualifies("mover"):
            continue  # mover's own (the application knows neither)
        found.append(Recorded(role, text, int(calls or 0), float(total or 0.0)))
    by_calls = sorted(found, key=lambda r: (-r.calls, -r.total_ms, r.text))[:limit]
    by_time = sorted(found, key=lambda r: (-r.total_ms, -r.calls, r.text))[:limit]
    chosen = sorted(dict.fromkeys([*by_calls, *by_time]), key=lambda r: (-r.calls, -r.total_ms, r.text))
    return chosen, len(found), hidden


# ---------------------------------------------------------------------------------------------
# The rehearsal


@dataclass(frozen=True)
class _Tables:
    """What one transaction reads of a pair before its statements: the tables' (and partitions')
    names, their index names, the source's oid."""
    source_oid: int
    source: frozenset[tuple[str, str]]
    target: frozenset[tuple[str, str]]
    source_indexes: frozenset[str]
    target_indexes: frozenset[str]


def _tables(cur: psycopg.Cursor, pair: Pair) -> _Tables:
    def tree(name: QualifiedName) -> tuple[int, frozenset[tuple[str, str]], frozenset[str]]:
        oid = introspect.table_oid(cur, name)
        if oid is None:
            raise BadInput(f"{name} does not exist", hint="`mover status NAME` shows where the migration stands")
        cur.execute("SELECT n.nspname, c.relname, c.oid FROM pg_partition_tree(%s) t JOIN pg_class c ON c.oid = t.relid"
                    " JOIN pg_namespace n ON n.oid = c.relnamespace", (oid,))
        rows = cur.fetchall() or [(name.schema, name.name, oid)]
        cur.execute("SELECT ic.relname FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid"
                    " WHERE i.indrelid = ANY(%s)", ([r[2] for r in rows],))
        return oid, frozenset((s, n) for s, n, _ in rows), frozenset(r[0] for r in cur.fetchall())

    source_oid, source, source_indexes = tree(pair.source)
    _, target, target_indexes = tree(pair.target)
    return _Tables(source_oid, source, target, source_indexes, target_indexes)


class _Skip(Exception):
    """The statement is not rehearsed; the message says why."""


@dataclass
class _Roles:
    """How each recording role's statements are planned, asked once per rehearsal."""
    db: Database
    known: dict[str, str | None] = field(default_factory=dict)  # role -> SET ROLE to it (None: as mover)
    refused: dict[str, str] = field(default_factory=dict)

    def planning_role(self, role: str | None) -> str | None:
        if role is None:
            raise _Skip("run by a role that no longer exists")
        if role in self.refused:
            raise _Skip(self.refused[role])
        if role not in self.known:
            try:
                self.known[role] = self.db.transaction(bind(_become, role), label="rehearsal role")
            except _Skip as exc:
                self.refused[role] = str(exc)
                raise
        return self.known[role]


def _become(cur: psycopg.Cursor, role: str) -> str | None:
    """The role to SET ROLE to for `role`'s statements: itself; None (mover's own) when it is
    mover's role or already holds mover's rights (it could run anything as mover anyway); _Skip
    when mover's role can become neither."""
    cur.execute("SELECT current_user, current_user = %s, pg_has_role(%s, current_user, 'USAGE')", (role, role))
    me, same, has_ours = one(cur)
    if same:
        return None
    try:
        with cur.connection.transaction(force_rollback=True):
            cur.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
        return role
    except psycopg.errors.InsufficientPrivilege:
        if has_ours:
            return None
    raise _Skip(f"run by role {display_ident(role)}, which mover's role {display_ident(me)} cannot SET ROLE to "
                f"(planning runs the statement's functions: mover plans a statement only as the role that ran it); "
                f"`GRANT {display_ident(role)} TO {display_ident(me)}` lets it, or run `mover rehearse` as a "
                f"superuser")


_SEARCH_PATH = """
SELECT coalesce(
  (SELECT substr(c, 13) FROM pg_db_role_setting s CROSS JOIN unnest(s.setconfig) c
   WHERE s.setrole = r.oid AND s.setdatabase = d.oid AND c LIKE 'search\\_path=%%'),
  (SELECT substr(c, 13) FROM pg_db_role_setting s CROSS JOIN unnest(s.setconfig) c
   WHERE s.setrole = r.oid AND s.setdatabase = 0 AND c LIKE 'search\\_path=%%'),
  (SELECT substr(c, 13) FROM pg_db_role_setting s CROSS JOIN unnest(s.setconfig) c
   WHERE s.setrole = 0 AND s.setdatabase = d.oid AND c LIKE 'search\\_path=%%'),
  (SELECT boot_val FROM pg_settings WHERE name = 'search_path'))
FROM pg_roles r, pg_database d WHERE r.rolname = %s AND d.datname = current_database()
"""


def _plan_under(cur: psycopg.Cursor, role: str) -> None:
    """The recording role's search_path (ALTER ROLE / ALTER DATABASE ... SET, else the server's
    default), pg_temp first (for relation names only: PostgreSQL never looks functions or operators
    up there); row-level security as the role sees it (no row is read); generic plans; strings lexed
    as statement_text lexes them."""
    cur.execute(_SEARCH_PATH, (role,))
    row = cur.fetchone()
    path = row[0] if row else '"$user", public'
    cur.execute("SELECT set_config('search_path', %s, true), set_config('row_security', 'on', true),"
                " set_config('plan_cache_mode', 'force_generic_plan', true),"
                " set_config('standard_conforming_strings', 'on', true)", ("pg_temp, " + path,))


def _explain(cur: psycopg.Cursor, text: str, prepared: bool | None) -> dict[str, Any]:
    """The generic plan of `text` (EXPLAIN's JSON), never executed."""
    if not (prepared if prepared is not None else not generic_plan_option(cur)):
        # By the simple protocol: in the extended one the server would take the text's $1 for a
        # parameter of the protocol's own. It runs one statement only because the text reads as one
        # (checked again here) lexed as the server lexes it (standard_conforming_strings on).
        if not statement_text.read(text).single:
            raise AssertionError("a rehearsed statement must be one statement")
        cur.execute(explain_sql.explain_generic(text))
        plan: dict[str, Any] = one(cur)[0][0]
        return plan
    # Before 16: prepared by the extended protocol (which refuses a second statement), EXPLAIN
    # EXECUTE with NULL for each parameter under force_generic_plan. Without partition pruning:
    # EXPLAIN initialises the plan, and pruning by those NULLs would leave no partition to show.
    name = "mover_rehearsal"
    cur.execute("SELECT set_config('enable_partition_pruning', 'off', true)")
    cur.execute(explain_sql.prepare(name, text), binary=True)
    try:
        with cur.connection.transaction():  # a failure leaves the transaction able to DEALLOCATE
            cur.execute("SELECT cardinality(parameter_types) FROM pg_prepared_statements WHERE name = %s", (name,))
            parameters = int(one(cur)[0] or 0)
            cur.execute(explain_sql.explain_execute(name, parameters), binary=True)
            plan = one(cur)[0][0]
    finally:
        cur.execute(explain_sql.deallocate(name))
    return plan


def _attempt(cur: psycopg.Cursor, work: Callable[[], T]) -> tuple[T | None, str | None]:
    """`work` in a savepoint that is rolled back whatever happens; its result, or the error the
    planner gave. A lock timeout, a cancel or a lost connection is no verdict: raised."""
    try:
        with cur.connection.transaction(force_rollback=True):
            return work(), None
    except psycopg.Error as exc:
        if is_retryable(exc) or is_connection_lost(exc) or isinstance(exc, psycopg.errors.QueryCanceled):
            raise
        diag = exc.diag
        return None, (diag.message_primary or str(exc).strip().splitlines()[0]) + \
            (f" ({diag.message_detail.rstrip('.')})" if diag.message_detail else "")


def _rehearse(cur: psycopg.Cursor, pair: Pair, tables: _Tables, rec: Recorded, as_role: str | None,
              settings: Settings) -> Finding:
    """One statement, in one transaction (the caller's), all of it rolled back: planned on the
    target under the source's name, then as recorded on the source (last: the source's lock for
    one planning); if the target's fails, once more through a view of the source, to tell a
    statement the target breaks from one the rehearsal cannot point at it."""
    st = statement_text.read(rec.text)
    src = pair.source
    assert src.schema is not None
    with cur.connection.transaction(force_rollback=True):
        _plan_under(cur, rec.role or "")
        qualified = st.mentions_qualified(src.schema, src.name)
        resolves = False
        if st.mentions_unqualified(src.name):
            cur.execute("SELECT to_regclass(%s)::oid = %s", (display_ident(src.name), tables.source_oid))
            resolves = bool(one(cur)[0])
        if not qualified and not resolves:
            return Finding(rec, SKIPPED, note=f"does not name {src} under the search_path of its role (another "
                                                 f"table, a column or an alias of that name)")
        if qualified and st.mentions_unqualified(src.name) and not resolves:
            return Finding(rec, SKIPPED, note=f"names {src} and, unqualified, another relation called "
                                                 f"{display_ident(src.name)}: not pointed at the target")
        pointed = st.redirected(src.schema, src.name, "pg_temp")

        def through(table: QualifiedName) -> dict[str, Any]:
            cur.execute(explain_sql.temp_view(src.name, table))
            if as_role is not None:
                cur.execute(explain_sql.grant_view(src.name, as_role))
            return as_recorded(pointed)

        def as_recorded(text: str) -> dict[str, Any]:
            if as_role is not None:
                cur.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(as_role)))
            return _explain(cur, text, settings.prepared)

        def on_source() -> dict[str, Any]:
            plan = as_recorded(rec.text)
            faults.point("rehearsal:source_planned")  # the source's lock is held here, and released next
            return plan

        after, after_error = _attempt(cur, lambda: through(pair.target))
        before, before_error = _attempt(cur, on_source)
        if before is None:
            return Finding(rec, SKIPPED, note=f"does not plan as recorded: {before_error}")
        before_shape = shape(before, tables.source, tables.source_indexes, src, src.name, {})
        if not before_shape.scans and not _modifies(before, tables.source):
            return Finding(rec, SKIPPED, before=before_shape, note=f"its plan does not read {src}")
        if after is None:
            _, control_error = _attempt(cur, lambda: through(src))
            if control_error is not None:
                return Finding(rec, SKIPPED, before=before_shape,
                               note=f"cannot be pointed at the target (through a view of the source it fails too: "
                                    f"{control_error})")
            return Finding(rec, FAILS, before=before_shape, error=after_error)
    assert after is not None
    after_shape = shape(after, tables.target, tables.target_indexes, pair.target, src.name, pair.index_names)
    note = None
    if any(rel in tables.source for rel in _relations(after)):
        note = f"its plan on the target still reads {src} elsewhere (a view or function over it)"
    return Finding(rec, verdict(before_shape, after_shape, settings.cost_factor), before_shape, after_shape,
                   note=note)


def verdict(before: PlanShape, after: PlanShape, factor: int) -> str:
    """Marked: a sequential scan of the target where the source's plan reached the table by an
    index; an estimated cost `factor` times the source's or more. Otherwise changed (other nodes
    or indexes, or far cheaper) or the same."""
    ratio = cost_factor(before.cost, after.cost)
    if after.seq_scans > before.seq_scans and before.index_scans > 0:
        return SEQ_SCAN
    if ratio >= factor:
        return COST_UP
    if after.nodes != before.nodes or ratio <= 1 / factor:
        return CHANGED
    return SAME


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out += _nodes(child)
    return out


def _relations(explained: dict[str, Any]) -> set[tuple[str, str]]:
    return {(n["Schema"], n["Relation Name"]) for n in _nodes(explained["Plan"]) if "Relation Name" in n}


def _modifies(explained: dict[str, Any], table: frozenset[tuple[str, str]]) -> bool:
    return any(n.get("Node Type") == "ModifyTable" and (n.get("Schema"), n.get("Relation Name")) in table
               for n in _nodes(explained["Plan"]))


def shape(explained: dict[str, Any], table: frozenset[tuple[str, str]], indexes: frozenset[str],
          own: QualifiedName, shown_as: str, index_names: Mapping[str, str]) -> PlanShape:
    """The plan's shape. The migrated table is `table` (its relation `own` and its partitions,
    whose scans count as the table's), shown as `shown_as` (the name the application uses); its
    indexes (`indexes`) by the names the swap gives them (`index_names`)."""
    top = explained["Plan"]
    nodes: list[str] = []
    scans: list[Scan] = []
    for n in _nodes(top):
        kind = str(n.get("Node Type"))
        rel = (str(n["Schema"]), str(n["Relation Name"])) if "Relation Name" in n else None
        index = n.get("Index Name")
        mine = rel in table if rel is not None else index in indexes
        shown_rel = None if rel is None else shown_as if rel == (own.schema, own.name) else rel[1]
        shown_index = index_names.get(index, index) if (index and mine) else index
        nodes.append(kind + (f" using {display_ident(shown_index)}" if shown_index else "")
                     + (f" on {display_ident(shown_rel)}" if shown_rel else ""))
        # The table's scans: its relation read (not a Bitmap Heap Scan, whose index scans below
        # it count), or one of its indexes read.
        if mine and kind != "ModifyTable" and ((kind.endswith("Scan") and kind != "Bitmap Heap Scan") or index):
            scans.append(Scan(kind, shown_rel, shown_index))
    return PlanShape(float(top.get("Total Cost", 0.0)), tuple(nodes), tuple(scans))


def _analyze(db: Database, pair: Pair, settings: Settings) -> tuple[bool, str | None]:
    """ANALYZE of the target, so that its plans use statistics as fresh as the swap would give
    them; under lock_timeout (its SHARE UPDATE EXCLUSIVE waits only on another ANALYZE, a VACUUM
    or an index build of the target, never on the application). Not granted: the rehearsal goes
    on with the statistics it has, and says so."""
    try:
        db.transaction(lambda cur: cur.execute(sql.SQL("ANALYZE {}").format(pair.target.ident)),
                       lock_timeout=f"{settings.lock_timeout_ms}ms", statement_timeout="0", attempts=ATTEMPTS,
                       label="analyze the target")
        return True, None
    except psycopg.errors.LockNotAvailable:
        return False, (f"not analyzed: another session held a lock on {pair.target} that ANALYZE waits for (an "
                       f"ANALYZE, VACUUM or index build); its plans use the statistics it had")


def rehearse(db: Database, pairs: Sequence[Pair], settings: Settings,
             statements: Mapping[Pair, Sequence[Recorded]] | None = None) -> list[TableRehearsal]:
    """Rehearse each pair's recorded statements (or, for a test, the `statements` given)."""
    view = statements_view(db) if statements is None else None
    roles = _Roles(db)
    out = []
    for pair in pairs:
        result = TableRehearsal(pair)
        if view is not None:
            chosen, result.considered, result.hidden = recorded(db, view, pair, settings.statements)
        else:
            chosen = list((statements or {}).get(pair, ()))
            result.considered = len(chosen)
        if settings.analyze:
            result.analyzed, result.analyze_note = _analyze(db, pair, settings)
        tables = db.transaction(bind(_tables, pair), label="rehearsal tables")
        for rec in chosen:
            result.findings.append(_one(db, roles, pair, tables, rec, settings))
        out.append(result)
    return out


def _one(db: Database, roles: _Roles, pair: Pair, tables: _Tables, rec: Recorded, settings: Settings) -> Finding:
    try:
        as_role = roles.planning_role(rec.role)
        return db.transaction(bind(_rehearse, pair, tables, rec, as_role, settings),
                              lock_timeout=f"{settings.lock_timeout_ms}ms", statement_timeout=PLAN_TIMEOUT,
                              attempts=ATTEMPTS, label="rehearse a statement")
    except _Skip as exc:
        return Finding(rec, SKIPPED, note=str(exc))
    except psycopg.errors.LockNotAvailable as exc:
        return Finding(rec, SKIPPED, note=f"a lock it needs was not granted within {settings.lock_timeout_ms}ms, "
                                          f"{ATTEMPTS} times ({str(exc).strip().splitlines()[0]}); the rehearsal "
                                          f"does not queue behind a DDL waiting on the table")
    except psycopg.errors.QueryCanceled:
        return Finding(rec, SKIPPED, note=f"planning took longer than {PLAN_TIMEOUT}")


# ---------------------------------------------------------------------------------------------
# A migration's rehearsal: `mover rehearse NAME`, and the cutover's preflight


def pairs_of(ctx: Context) -> list[Pair]:
    """The migration's tables: one pair, or one per table of a family (issue 27), in its order."""
    return ctx.db.transaction(lambda cur: [Pair.of(cur, t.migration) for t in ctx.family(cur)], label="rehearsal")


def of_migration(ctx: Context, top: int | None = None) -> dict[str, Any]:
    """`mover rehearse NAME`: the rehearsal of the migration's tables, as plain data."""
    settings = Settings.of(ctx.plan, top)
    tables = rehearse(ctx.db, pairs_of(ctx), settings)
    return summary(ctx.migration.name, tables, settings)


def summary(name: str, tables: Sequence[TableRehearsal], settings: Settings) -> dict[str, Any]:
    return {"migration": name, "statements": settings.statements, "cost_factor": settings.cost_factor,
            "marked": sum(len(t.marked) for t in tables), "tables": [t.as_dict() for t in tables]}


def marked_message(name: str, result: dict[str, Any]) -> str:
    """What the marked findings are, in one sentence (the Waiting error's message)."""
    parts = []
    for t in result["tables"]:
        kinds: dict[str, int] = {}
        for s in t["statements"]:
            if s["marked"]:
                kinds[s["verdict"]] = kinds.get(s["verdict"], 0) + 1
        if kinds:
            words = {SEQ_SCAN: "read it sequentially where the source's plan uses an index",
                     COST_UP: f"cost {result['cost_factor']} or more times as much",
                     FAILS: "do not plan at all (an error)"}
            parts.append(f"{sum(kinds.values())} of the {t['rehearsed']} statements rehearsed plan markedly worse on "
                         f"{t['target']} than on {t['source']}: "
                         + ", ".join(f"{n} {words[k]}" for k, n in kinds.items()))
    return f"query rehearsal of migration {name!r}: " + "; ".join(parts)


def before_cutover(ctx: Context) -> None:
    """The cutover's preflight with `[cutover] rehearse = true`: the swap is refused (Waiting,
    exit 3; nothing swapped) while a recorded statement plans markedly worse on the target, or
    pg_stat_statements cannot be read. Recorded as a `rehearsal` event either way."""
    plan = ctx.plan
    if not plan.cutover.rehearse:
        return
    name = ctx.migration.name
    off = f"`mover set {name} cutover.rehearse=false` lets the swap go ahead without it"
    try:
        result = of_migration(ctx)
    except StatementsUnavailable as exc:
        raise Waiting(f"[cutover] rehearse is on, but {exc.message}", hint=f"{exc.hint}; or {off}") from exc
    counts = {t["source"]: t["verdicts"] for t in result["tables"]}
    message = (marked_message(name, result) if result["marked"] else
               f"query rehearsal: {sum(t['rehearsed'] for t in result['tables'])} statements plan alike on the "
               f"target")
    ctx.db.transaction(lambda cur: control.event(cur, ctx.mid, ctx.owner, "cutover", "rehearsal", message,
                                                 {"verdicts": counts, "marked": result["marked"]}),
                       label="rehearsal event")
    ctx.report("rehearsal", statements=sum(t["rehearsed"] for t in result["tables"]), marked=result["marked"])
    if result["marked"]:
        raise Waiting(message, hint=f"`mover rehearse {name}` shows each statement with both plans; change what "
                                    f"makes it worse (an index, a type, the statement), or {off}")


def describe(plan: Plan) -> list[str]:
    """What `plan check` prints of the rehearsal before the swap (nothing when it is off)."""
    if not plan.cutover.rehearse:
        return []
    s = Settings.of(plan)
    return [f"-- first, [cutover] rehearse: ANALYZE of the target, then EXPLAIN (never executed) of the "
            f"{s.statements} statements on the source pg_stat_statements recorded most (by calls, and by total "
            f"time), each on the target under the source's name, as the role that ran it, in a transaction rolled "
            f"back; the swap is refused while one plans markedly worse (a sequential scan where the source's plan "
            f"uses an index, a cost {s.cost_factor} or more times higher, or no plan)"]
