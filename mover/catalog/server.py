"""What this server version has: the one place where mover's SQL or behaviour differs by
PostgreSQL version (supported: 15 to 18; docs/operating.md, "Server versions", lists each
catalog change of 17 and 18 and what mover does with it).

Everything else in mover reads the catalog the same way on every version. A version matters
here only where a catalog column exists from some version on (a query that names it fails on
an older server), where a catalog flag means less than it did (on 18 `attnotnull` is set by a
NOT NULL constraint that is NOT VALID, so old rows may still hold NULL), or where a statement
is refused on one version and accepted on another. Callers ask `of(cur)` and use its flags and
SQL fragments; nobody else reads `server_version_num`.

The fragments are constant SQL text chosen by version (never built from input), for the
catalog queries that differ.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

OLDEST = 150000  # the oldest server the suite covers (README: "Supported servers")
NEWEST_TESTED = 18  # the newest major version the suite covers


@dataclass(frozen=True)
class Server:
    """Flags and catalog fragments of one server version (`server_version_num`, e.g. 180006)."""

    version_num: int

    @property
    def major(self) -> int:
        return self.version_num // 10000

    # -- PostgreSQL 14: reconcile's row hash ---------------------------------------------------

    @property
    def hash_record_extended(self) -> bool:
        """hash_record_extended() (14), which reconcile's 64-bit row hash is built on."""
        return self.version_num >= 140000

    # -- PostgreSQL 17 -------------------------------------------------------------------------

    @property
    def maintain_privilege(self) -> bool:
        """The MAINTAIN table privilege (ACL letter 'm'): carried like any grant (aclexplode names it)."""
        return self.major >= 17

    @property
    def identity_on_partitioned(self) -> bool:
        """Identity columns on partitioned tables (the partitions share the parent's sequence).
        Before 17 CREATE TABLE ... (LIKE ... INCLUDING IDENTITY) PARTITION BY fails."""
        return self.major >= 17

    @property
    def exclusion_on_partitioned(self) -> bool:
        """Exclusion constraints on partitioned tables, when they compare every partition column
        with equality (two rows one excludes then fall in one partition)."""
        return self.major >= 17

    # -- PostgreSQL 18 -------------------------------------------------------------------------

    @property
    def catalogued_not_null(self) -> bool:
        """NOT NULL constraints are rows of pg_constraint (contype 'n'): named, NOT VALID, NO
        INHERIT. A NOT VALID one still sets attnotnull: old rows may hold NULL."""
        return self.major >= 18

    @property
    def virtual_generated(self) -> bool:
        """Virtual generated columns (attgenerated 'v', the default for GENERATED ALWAYS AS)."""
        return self.major >= 18

    @property
    def temporal_constraints(self) -> bool:
        """pg_constraint.conperiod: PRIMARY KEY / UNIQUE ... WITHOUT OVERLAPS and FOREIGN KEY ...
        PERIOD (temporal keys, exclusion constraints underneath)."""
        return self.major >= 18

    @property
    def enforced_flag(self) -> bool:
        """pg_constraint.conenforced: CHECK and FOREIGN KEY constraints NOT ENFORCED."""
        return self.major >= 18

    @property
    def unlogged_partitioned(self) -> bool:
        """CREATE UNLOGGED TABLE ... PARTITION BY: accepted before 18 (and meaningless: the
        partitions are created logged), refused from 18 on."""
        return self.major < 18

    @property
    def not_valid_foreign_key_on_partitioned(self) -> bool:
        """ALTER TABLE <partitioned> ADD FOREIGN KEY ... NOT VALID (18). Before 18 mover adds it to
        each partition and attaches them after validation (mover/engines/swap/carry.py), which works on
        every version, so the swap does the same on all of them."""
        return self.major >= 18

    @property
    def split_merge_partition(self) -> bool:
        """ALTER TABLE ... SPLIT / MERGE PARTITION(S): in no release up to 18 (committed to 17's
        development and reverted before its release). `mover partitions maintain` splits a range off
        the default partition by hand instead: create, move the rows, attach (engines/partitioning/partitions.py)."""
        return False

    # -- Catalog fragments ---------------------------------------------------------------------

    def not_null_validated(self, attribute: str) -> sql.Composable:
        """A boolean SQL expression over the pg_attribute row aliased `attribute`: the column holds
        no NULL (its NOT NULL is validated). On 18 attnotnull alone is not enough: a NOT NULL
        constraint added NOT VALID sets it while old rows may still hold NULL."""
        a = sql.Identifier(attribute)
        if not self.catalogued_not_null:
            return sql.SQL("{}.attnotnull").format(a)
        return sql.SQL("({a}.attnotnull AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint nn"
                       " WHERE nn.conrelid = {a}.attrelid AND nn.contype = 'n' AND nn.conkey[1] = {a}.attnum"
                       " AND NOT nn.convalidated))").format(a=a)

    def conperiod(self, constraint: str) -> sql.Composable:
        """pg_constraint.conperiod of the row aliased `constraint`, false where the column does not exist."""
        if not self.temporal_constraints:
            return sql.SQL("false")
        return sql.SQL("{}.conperiod").format(sql.Identifier(constraint))

    def conenforced(self, constraint: str) -> sql.Composable:
        """pg_constraint.conenforced of the row aliased `constraint`, true where the column does not exist."""
        if not self.enforced_flag:
            return sql.SQL("true")
        return sql.SQL("{}.conenforced").format(sql.Identifier(constraint))


def of(cur: psycopg.Cursor) -> Server:
    """The server this cursor talks to. libpq learnt the version when it connected
    (server_version_num, PQserverVersion): no query, so any catalog read may ask."""
    return Server(cur.connection.info.server_version)


def package_name(cur: psycopg.Cursor, extension: str) -> str:
    """The Debian/Ubuntu package of a server extension for this server's major version
    (e.g. postgresql-18-partman), for the hint of a plan check that needs it."""
    return f"postgresql-{of(cur).major}-{extension}"
