"""Key lineage: a TOAST column left to a row whose key was changed from another (a
primary-key change, `FROM_KEY_PREFIX` and `FROM_LSN`) takes the old key's value as of
that change, wherever it is.

The fold gives each such row its pointer, the old key and the change's LSN, and a
`KEY_CHANGE` row for each delete that moved a key: the old key's values as of it, or,
where the fold's records did not hold them, its own pointer (the key's create was
itself a key change: the key it came from, at that change's LSN; else the old key's row
before the batch). A pointer is followed, in order:

1. into the batch's `KEY_CHANGE` rows (again while it leads to another: chains and
   cycles of key changes, each step to an earlier change);
2. into the ledger of key changes earlier batches could not pair (a delete loaded before
   the create of its new key);
3. into the table's row of the key pointed at (the change's delete not loaded yet, or a
   key's row before the batch; soft-deleted rows keep their values).

A row whose pointer found nothing takes NULL, never the table's value of its own key
(that row is another's). `KEY_CHANGE` rows no row of the batch pointed at go to the
ledger, in the load's commit's course (`cdclake.iceberg.key_changes`); the ledger
entries the batch's pointers name are removed once it is committed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdclake.debezium.schema import LSN, OP, TopicSchema
from cdclake.resolve.rules import (
    FROM_KEY_PREFIX,
    FROM_LSN,
    KEY_CHANGE,
    KEY_CREATE,
    TOAST_PREFIX,
    toastable,
)

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


def linked(rows, schema: TopicSchema, lake, ledger) -> Linked:
    """`rows` (the resolved rows, with `LINEAGE_OPS` rows) with every pointer followed:
    `lake` is the table before the batch (None: no table), `ledger` its key changes
    ledger (None: none); see the module."""
    from pyspark.sql import functions as F

    if FROM_LSN not in rows.columns:
        return Linked(rows, None, None)
    keys = schema.key_names
    froms = [f"{FROM_KEY_PREFIX}{k}" for k in keys]
    toast = [c.name for c in toastable(schema) if c.name in rows.columns]
    flags = [f"{TOAST_PREFIX}{c}" for c in toast]
    op = F.col(f"`{OP}`")
    # the changes the batch's creates took their rows from: done with, wherever they are
    taken = rows.where(op == KEY_CREATE).select(*froms, FROM_LSN).distinct()
    rows = rows.where(~op.eqNullSafe(KEY_CREATE))
    moved = op.eqNullSafe(KEY_CHANGE)
    unset = F.lit(False)
    for f in flags:
        unset = unset | F.col(f"`{f}`")
    # a key change whose values are its key's row before the batch points at that row
    own = moved & unset & F.col(f"`{FROM_LSN}`").isNull()
    rows = rows.select(*[F.when(own, F.col(f"`{keys[froms.index(c)]}`")).otherwise(F.col(f"`{c}`"))
                         .alias(c) if c in froms else F.col(f"`{c}`")
                         for c in rows.columns])  # fmt: skip
    pointer = F.col(f"`{froms[0]}`").isNotNull()
    if rows.where(pointer).limit(1).count():
        rows = _followed(rows.withColumn(_POINTED, pointer), keys, toast, flags, froms,
                         lake, ledger)  # fmt: skip
    named = taken.toDF(*(f"_cdc_t{i}" for i in range(len(keys))), "_cdc_tlsn")
    on = [F.col(f"`{k}`") == F.col(f"_cdc_t{i}") for i, k in enumerate(keys)]
    kept = rows.where(moved).join(named, [*on, F.col(LSN) == F.col("_cdc_tlsn")], "left_anti")
    return Linked(rows.where(~moved).drop(*froms, FROM_LSN), kept.select(*keys, LSN, *toast), taken)


def _followed(rows, keys, toast, flags, froms, lake, ledger):
    """`rows` (`_POINTED`: they had a pointer) with their pointers followed (the
    module's order), their TOAST flags then cleared."""
    from pyspark.sql import functions as F

    moved = F.col(f"`{OP}`").eqNullSafe(KEY_CHANGE)
    for _ in range(rows.where(moved).count()):  # each step leads to an earlier change
        changes = _source(rows.where(moved), keys, toast, flags, froms, True)
        ahead = rows.join(changes, _on(froms, True), "left")
        if not ahead.where(F.col(_HIT).isNotNull()).limit(1).count():
            break
        rows = _taken(ahead, rows.columns, toast, flags, froms, pointer=True).localCheckpoint()
    if ledger is not None:
        entries = _source(ledger.dropDuplicates([*keys, LSN]), keys, toast, [], froms, True)
        rows = _taken(rows.join(entries, _on(froms, True), "left"), rows.columns, toast, flags,
                      froms)  # fmt: skip
    if lake is not None:
        held = _source(lake, keys, toast, [], froms, False)
        rows = _taken(rows.join(held, _on(froms, False), "left"), rows.columns, toast, flags,
                      froms)  # fmt: skip
    # a row that pointed elsewhere keeps nothing of its own key's table row
    had = F.col(_POINTED)
    return rows.select(*[F.when(had, F.lit(False)).otherwise(F.col(f"`{c}`")).alias(c)
                         if c in flags else F.col(f"`{c}`")
                         for c in rows.columns if c != _POINTED])  # fmt: skip


def _source(frame, keys, toast, flags, froms, by_lsn: bool):
    """`frame`'s key (and LSN), TOAST values, flags and pointer, named apart."""
    from pyspark.sql import functions as F

    cols = [F.col(f"`{k}`").alias(f"_cdc_src_k{i}") for i, k in enumerate(keys)]
    if by_lsn:
        cols.append(F.col(f"`{LSN}`").alias("_cdc_src_lsn"))
    present = set(frame.columns)
    for j, c in enumerate(toast):
        cols.append((F.col(f"`{c}`") if c in present else F.lit(None)).alias(f"_cdc_src_v{j}"))
        flag = f"{TOAST_PREFIX}{c}"
        cols.append((F.col(f"`{flag}`") if flag in flags and flag in present
                     else F.lit(False)).alias(f"_cdc_src_f{j}"))  # fmt: skip
    for i, f in enumerate([*froms, FROM_LSN]):
        cols.append((F.col(f"`{f}`") if f in present else F.lit(None)).alias(f"_cdc_src_p{i}"))
    return frame.select(*cols, F.lit(True).alias(_HIT))


def _on(froms, by_lsn: bool):
    from pyspark.sql import functions as F

    cond = [F.col(f"`{f}`") == F.col(f"_cdc_src_k{i}") for i, f in enumerate(froms)]
    if by_lsn:
        cond.append(F.col(f"`{FROM_LSN}`") == F.col("_cdc_src_lsn"))
    out = cond[0]
    for c in cond[1:]:
        out = out & c
    return out


def _taken(joined, columns, toast, flags, froms, pointer: bool = False):
    """The rows of `joined` (rows left-joined with a `_source`): where a source row was
    found, each flagged TOAST column takes its value and keeps its flag only where the
    source's is set; the pointer becomes the source's (`pointer`) or is done."""
    from pyspark.sql import functions as F

    hit = F.col(_HIT).isNotNull()
    out = []
    for c in columns:
        col = F.col(f"`{c}`")
        if c in toast:
            j = toast.index(c)
            flag = F.col(f"`{TOAST_PREFIX}{c}`")
            out.append(F.when(hit & flag, F.col(f"_cdc_src_v{j}")).otherwise(col).alias(c))
        elif c in flags:
            j = flags.index(c)
            out.append(F.when(hit, col & F.col(f"_cdc_src_f{j}")).otherwise(col).alias(c))
        elif c in froms or c == FROM_LSN:
            i = [*froms, FROM_LSN].index(c)
            done = F.lit(None).cast(joined.schema[c].dataType)
            out.append(F.when(hit, F.col(f"_cdc_src_p{i}") if pointer else done)
                       .otherwise(col).alias(c))  # fmt: skip
        else:
            out.append(col)
    return joined.select(*out)
