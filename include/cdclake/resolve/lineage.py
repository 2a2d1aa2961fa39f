"""Key lineage: a TOAST column left to a row whose key was changed from another (a
primary-key change, `FROM_KEY_PREFIX` and `FROM_LSN`) takes the old key's value as of
that change, wherever it is.

The fold gives each such row its pointer, the old key and the change's LSN, and a
`KEY_CHANGE` row for each delete that moved a key: the old key's values as of it, or,
where the fold's records did not hold them, its own pointer (the key's create was
itself a key change: the key it came from, at that change's LSN; else the old key's row
before the batch). A pointer is followed, in order:

0. a `KEY_CHANGE` row the ledger holds (below) was loaded before: the batch's is a
   re-send, and takes the ledger's values (its key's earlier changes are loaded);
1. into the batch's `KEY_CHANGE` rows (again while it leads to another: chains and
   cycles of key changes, each step to an earlier change);
2. into the ledger of key changes earlier batches could not pair (a delete loaded before
   the create of its new key);
3. into the table's row of the key pointed at (the change's delete not loaded yet, or a
   key's row before the batch; soft-deleted rows keep their values).

A row whose pointer found nothing takes NULL, never the table's value of its own key
(that row is another's). `KEY_CHANGE` rows whose create the batch does not hold go to
the ledger before the table's commit (`cdclake.iceberg.key_changes`); the entries of
the changes the batch's creates took (`KEY_CREATE` rows) are removed after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdclake.debezium.schema import LSN, OP, TopicSchema
from cdclake.resolve.rules import (
    FROM_KEY_PREFIX,
    FROM_LSN,
    KEY_CHANGE,
    KEY_CREATE,
    LINEAGE_OPS,
    TOAST_PREFIX,
    toastable,
)
from cdclake.spark import is_connect

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, Row

_HIT = "_cdc_src_hit"
_POINTED = "_cdc_pointed"


@dataclass(frozen=True)
class Linked:
    """The rows of the table with their pointers followed; the key changes a later batch
    may need (key columns, `LSN`, TOAST columns; None: none), and the changes the
    batch's creates took their rows from (from-key columns and `FROM_LSN`): ledger
    entries done with once the batch is committed."""

    rows: Any
    kept: Any | None
    taken: Any | None


def linked(
    rows: DataFrame,
    schema: TopicSchema,
    lake: DataFrame | None,
    ledger: Callable[[], DataFrame | None],
) -> Linked:
    """`rows` (the resolved rows, with `LINEAGE_OPS` rows) with every pointer followed:
    `lake` is the table before the batch (None: no table), `ledger()` its key changes
    ledger (None: none); see the module. One Spark job reads the batch's pointers (key
    changes are few); the rest joins into the rows' plan."""
    from pyspark.sql import functions as F

    if FROM_LSN not in rows.columns:
        return Linked(rows, None, None)
    keys = schema.key_names
    froms = [f"{FROM_KEY_PREFIX}{k}" for k in keys]
    toast = [c.name for c in toastable(schema) if c.name in rows.columns]
    flags = [f"{TOAST_PREFIX}{c}" for c in toast]
    op = F.col(f"`{OP}`")
    moved = op.eqNullSafe(KEY_CHANGE)
    unset = F.lit(False)
    for f in flags:
        unset = unset | F.col(f"`{f}`")
    # a key change whose values are its key's row before the batch points at that row
    own = moved & unset & F.col(f"`{FROM_LSN}`").isNull()
    rows = rows.select(
        *[
            F.when(own, F.col(f"`{keys[froms.index(c)]}`")).otherwise(F.col(f"`{c}`")).alias(c)
            if c in froms
            else F.col(f"`{c}`")
            for c in rows.columns
        ]
    )
    graph = _graph(
        rows.where(op.isin(*LINEAGE_OPS) | F.col(f"`{froms[0]}`").isNotNull())
        .select(*keys, LSN, OP, *froms, FROM_LSN)
        .collect(),
        len(keys),
    )
    if graph is None:
        return Linked(rows.drop(*froms, FROM_LSN), None, None)  # no key changed
    # the changes the batch's creates took their rows from: done with, wherever they are
    taken = rows.where(op == KEY_CREATE).select(*froms, FROM_LSN).distinct()
    rows = rows.where(~op.eqNullSafe(KEY_CREATE))
    if graph.pointers:
        pointer = F.col(f"`{froms[0]}`").isNotNull()
        rows = _followed(
            rows.withColumn(_POINTED, pointer),
            keys,
            toast,
            flags,
            froms,
            graph.steps,
            lake if graph.outside else None,
            ledger(),
        )
    kept = None
    if graph.kept:
        named = taken.toDF(*(f"_cdc_t{i}" for i in range(len(keys))), "_cdc_tlsn")
        on = [F.col(f"`{k}`") == F.col(f"_cdc_t{i}") for i, k in enumerate(keys)]
        kept = (
            rows.where(moved)
            .join(named, [*on, F.col(LSN) == F.col("_cdc_tlsn")], "left_anti")
            .select(*keys, LSN, *toast)
        )
    return Linked(rows.where(~moved).drop(*froms, FROM_LSN), kept, taken if graph.taken else None)


@dataclass(frozen=True)
class _Graph:
    """The batch's key changes as the driver sees them: whether a row points elsewhere,
    how many steps through the batch's changes its longest chain takes, whether a pointer
    leaves the batch (to the ledger or the table), whether a create took a change, and
    whether a change is left for a later batch."""

    pointers: bool
    steps: int
    outside: bool
    taken: bool
    kept: bool


def _graph(found: list[Row], width: int) -> _Graph | None:
    """The `_Graph` of the batch's lineage rows and rows with a pointer (each: its key
    columns, LSN, operation and pointer); None: none."""
    if not found:
        return None
    changes: dict[tuple[tuple[Any, ...], Any], tuple[tuple[Any, ...], Any] | None] = {}
    pointers: list[tuple[tuple[Any, ...], Any]] = []
    taken: set[tuple[tuple[Any, ...], Any] | None] = set()
    for r in found:
        key, lsn, op = tuple(r[:width]), r[width], r[width + 1]
        to: tuple[tuple[Any, ...], Any] | None = (
            tuple(r[width + 2 : 2 * width + 2]),
            r[2 * width + 2],
        )
        if to is not None and to[0][0] is None:  # points nowhere
            to = None
        if op == KEY_CREATE:
            taken.add(to)
        elif op == KEY_CHANGE:
            changes[(key, lsn)] = to
        if op != KEY_CREATE and to is not None:
            pointers.append(to)
    steps, outside = 0, False
    for start in pointers:
        to, n = start, 0
        while to in changes and n <= len(changes):  # each step goes to an earlier change
            to, n = changes[to], n + 1
        steps, outside = max(steps, n), outside or to is not None
    return _Graph(bool(pointers), steps, outside, bool(taken), bool(set(changes) - taken))


def _followed(
    rows: DataFrame,
    keys: Sequence[str],
    toast: list[str],
    flags: list[str],
    froms: list[str],
    steps: int,
    lake: DataFrame | None,
    ledger: DataFrame | None,
) -> DataFrame:
    """`rows` (`_POINTED`: they had a pointer) with their pointers followed `steps` times
    through the batch's changes, then into the ledger and the table (None: not needed),
    their TOAST flags then cleared."""
    from pyspark.sql import functions as F

    moved = F.col(f"`{OP}`").eqNullSafe(KEY_CHANGE)
    entries = None
    if ledger is not None:
        entries = _source(ledger.dropDuplicates([*keys, LSN]), keys, toast, [], froms, True)
        # a change the ledger holds was loaded before: the batch's is a re-send, whose
        # state the batch cannot know (its key's earlier changes are loaded)
        own = [F.col(f"`{k}`") == F.col(f"_cdc_src_k{i}") for i, k in enumerate(keys)]
        on = moved & F.col(f"`{LSN}`").eqNullSafe(F.col("_cdc_src_lsn"))
        for c in own:
            on = on & c
        rows = _taken(
            rows.join(entries, on, "left"), rows.columns, toast, flags, froms, forced=True
        )
    for _ in range(steps):
        changes = _source(rows.where(moved), keys, toast, flags, froms, True)
        rows = _taken(
            rows.join(changes, _on(froms, True), "left"),
            rows.columns,
            toast,
            flags,
            froms,
            pointer=True,
        )
        # each step reads the last twice: a long chain's plan would double (Spark Connect
        # 3.5 has no checkpoint: there it does)
        if steps > 2 and not is_connect(rows.sparkSession):
            rows = rows.localCheckpoint()
    if entries is not None:
        rows = _taken(
            rows.join(entries, _on(froms, True), "left"), rows.columns, toast, flags, froms
        )
    if lake is not None:
        held = _source(lake, keys, toast, [], froms, False)
        rows = _taken(rows.join(held, _on(froms, False), "left"), rows.columns, toast, flags, froms)
    # a row that pointed elsewhere keeps nothing of its own key's table row
    had = F.col(_POINTED)
    return rows.select(
        *[
            F.when(had, F.lit(False)).otherwise(F.col(f"`{c}`")).alias(c)
            if c in flags
            else F.col(f"`{c}`")
            for c in rows.columns
            if c != _POINTED
        ]
    )


def _source(
    frame: DataFrame,
    keys: Sequence[str],
    toast: list[str],
    flags: list[str],
    froms: list[str],
    by_lsn: bool,
) -> DataFrame:
    """`frame`'s key (and LSN), TOAST values, flags and pointer, named apart."""
    from pyspark.sql import functions as F

    cols = [F.col(f"`{k}`").alias(f"_cdc_src_k{i}") for i, k in enumerate(keys)]
    if by_lsn:
        cols.append(F.col(f"`{LSN}`").alias("_cdc_src_lsn"))
    present = set(frame.columns)
    for j, c in enumerate(toast):
        cols.append((F.col(f"`{c}`") if c in present else F.lit(None)).alias(f"_cdc_src_v{j}"))
        flag = f"{TOAST_PREFIX}{c}"
        cols.append(
            (F.col(f"`{flag}`") if flag in flags and flag in present else F.lit(False)).alias(
                f"_cdc_src_f{j}"
            )
        )
    for i, f in enumerate([*froms, FROM_LSN]):
        cols.append((F.col(f"`{f}`") if f in present else F.lit(None)).alias(f"_cdc_src_p{i}"))
    return frame.select(*cols, F.lit(True).alias(_HIT))


def _on(froms: list[str], by_lsn: bool) -> SparkColumn:
    from pyspark.sql import functions as F

    cond = [F.col(f"`{f}`") == F.col(f"_cdc_src_k{i}") for i, f in enumerate(froms)]
    if by_lsn:
        cond.append(F.col(f"`{FROM_LSN}`") == F.col("_cdc_src_lsn"))
    out = cond[0]
    for c in cond[1:]:
        out = out & c
    return out


def _taken(
    joined: DataFrame,
    columns: list[str],
    toast: list[str],
    flags: list[str],
    froms: list[str],
    pointer: bool = False,
    forced: bool = False,
) -> DataFrame:
    """The rows of `joined` (rows left-joined with a `_source`): where a source row was
    found, each flagged TOAST column (each, `forced`) takes its value and keeps its flag
    only where the source's is set; the pointer becomes the source's (`pointer`) or is
    done."""
    from pyspark.sql import functions as F

    hit = F.col(_HIT).isNotNull()
    out = []
    for c in columns:
        col = F.col(f"`{c}`")
        if c in toast:
            j = toast.index(c)
            flag = F.lit(True) if forced else F.col(f"`{TOAST_PREFIX}{c}`")
            out.append(F.when(hit & flag, F.col(f"_cdc_src_v{j}")).otherwise(col).alias(c))
        elif c in flags:
            j = flags.index(c)
            out.append(F.when(hit, col & F.col(f"_cdc_src_f{j}")).otherwise(col).alias(c))
        elif c in froms or c == FROM_LSN:
            i = [*froms, FROM_LSN].index(c)
            done = F.lit(None).cast(joined.schema[c].dataType)
            out.append(
                F.when(hit, F.col(f"_cdc_src_p{i}") if pointer else done).otherwise(col).alias(c)
            )
        else:
            out.append(col)
    return joined.select(*out)
