"""The target's and the old table's names: in the source's schema, all three different, free."""

from __future__ import annotations

from mover import names
from mover.catalog import introspect
from mover.checks import Subject
from mover.db import one
from mover.errors import PlanError
from mover.names import QualifiedName
from mover.state import control


def _sibling(source: QualifiedName, name: QualifiedName | None, key: str, suffix: str) -> QualifiedName:
    assert source.schema is not None
    if name is None:
        return QualifiedName(source.schema, names.derived(source.name, suffix))
    if name.schema is None:
        name = name.with_schema(source.schema)
    if name.schema != source.schema:
        raise PlanError(f"{key}: {name} must be in the source's schema {names.display_ident(source.schema)}",
                        hint="the swap renames tables within one schema")
    return name


def resolve(s: Subject) -> None:
    source = s.src
    target = old = None
    try:
        target = _sibling(source, s.plan.target, "[target] name", "_new")
    except PlanError as exc:
        s.report(exc)
    old = _sibling(source, s.plan.rollback.old_name, "[rollback] old_name", "_old")
    if target is None:
        return
    if len({target, old, source}) < 3:
        raise PlanError(f"source {source}, target {target} and old name {old} must all differ",
                        hint="set [target] name and [rollback] old_name to two new names")
    s.target, s.old = target, old


def not_being_moved(s: Subject) -> None:
    # Another migration of the same source first: its target explains why a name is taken.
    other = control.active_on_source(s.cur, s.src) if control.schema_ready(s.cur) else None
    if other is not None and other.name != s.plan.name:
        raise PlanError(f"table {s.src} is already being moved by migration {other.name!r}",
                        hint=f"finish or `mover abort {other.name}` first")


def free(s: Subject) -> None:
    assert s.old is not None
    for name, key in ((s.new, "[target] name"), (s.old, "[rollback] old_name")):
        if introspect.exists(s.cur, name):
            s.report(PlanError(f"{key}: {name} already exists", hint="choose another name or drop that table"))
            continue
        # A table brings a row type of its own name: an enum or a domain of that name blocks it too.
        s.cur.execute("SELECT EXISTS (SELECT 1 FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"
                      " WHERE n.nspname = %s AND t.typname = %s)", (name.schema, name.name))
        if one(s.cur)[0]:
            s.report(PlanError(f"{key}: {name} already exists as a type",
                               hint="choose another name or drop that type"))
