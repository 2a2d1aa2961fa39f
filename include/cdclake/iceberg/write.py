"""A table's resolved rows written: MERGE (or append into an empty table) with the batch's
offsets in the same commit, and the check that the commit carries them."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, cast

from cdclake.config import DeleteMode, PipelineConfig, TableConfig
from cdclake.debezium.schema import DELETED, OFFSET, PARTITION, TopicSchema
from cdclake.exceptions import CommitConflictError
from cdclake.iceberg.catalog import lake_table, summary_of
from cdclake.iceberg.deleted_keys import record_deleted_keys, with_deleted_lsn
from cdclake.iceberg.jvm_commit import jvm_check_commit, jvm_staged
from cdclake.iceberg.key_changes import (
    forget_key_changes,
    record_key_changes,
)
from cdclake.iceberg.merge_sql import (
    INTEGER_TYPES,
    KEY_FILTER_TYPES,
    KeyRange,
    build_append_sql,
    build_first_load_sql,
    build_merge_sql,
    key_filter_sql,
)
from cdclake.iceberg.tables import (
    STAGE_PREFIX,
    TableState,
    append_to_empty,
    apply_table_settings,
    commit_empty,
    conflicts_reported,
    current_snapshot,
    ensure_table,
)
from cdclake.offsets import (
    SUMMARY_BATCH,
    SUMMARY_CUT,
    SUMMARY_DELETES,
    SUMMARY_HEAL,
    SUMMARY_HEALED,
    SUMMARY_OFFSETS,
    SUMMARY_RECORDS,
    SUMMARY_SOURCE_TS,
    SUMMARY_TRUNCATE,
    SUMMARY_UPSERTS,
    BatchPlan,
    Cut,
    Heal,
    TopicPartition,
    encode_offsets,
)
from cdclake.placement import Tuning
from cdclake.resolved import TOAST_PREFIX, Resolved, Truncate
from cdclake.spark import is_connect

if TYPE_CHECKING:
    from pyiceberg.table import Table as LakeTable
    from pyspark.sql import DataFrame, Row, SparkSession

log = logging.getLogger(__name__)


class WrittenBy(StrEnum):
    """How a batch's rows were written into a table (`TableResult.written_by`)."""

    MERGE = "merge"
    # a table without a key, or a keyed table that held no row (as on a first load): the
    # MERGE's inserts alone, without its join
    APPEND = "append"


class Writing(Protocol):
    """What a table's write needs of its batch (`cdclake.batch.Batch` holds it): the
    session, the pipeline, the plan and the tuning."""

    spark: Any
    pipeline: PipelineConfig
    plan: BatchPlan
    tuning: Tuning


class KeyMoves(Protocol):
    """The key changes of a batch a write keeps and forgets (`cdclake.resolve.lineage.Linked`
    holds them): those a later batch may need, those the batch's creates took (None: none)."""

    @property
    def kept(self) -> DataFrame | None: ...

    @property
    def taken(self) -> DataFrame | None: ...


def write_table(
    batch: Writing,
    table: TableConfig,
    schema: TopicSchema,
    state: TableState,
    known: dict[str, str],
    new_offsets: dict[TopicPartition, int],
    resolved: Resolved,
    records: int,
    moved: KeyMoves | None = None,
) -> tuple[int | None, WrittenBy, int]:
    """MERGE (or append) the resolved rows of the batch's `records` records into the
    table, its new offsets in the same commit: the id of the snapshot that carries them,
    how the rows were written (`TableResult.written_by`) and the rows a heal's sweep
    removed (`_sweep`). `moved`: the key changes
    of the batch (`cdclake.resolve.lineage.Linked`), kept for later batches before the
    commit, those the batch's creates took forgotten after it."""
    spark, qualified = batch.spark, batch.pipeline.qualified_target(table)
    with conflicts_reported(
        f"{qualified}: another run wrote to this table at the same time; this run's "
        "batch was not committed to it. Plan again."
    ):
        soft = table.delete_mode is DeleteMode.SOFT
        lake_columns = ensure_table(
            spark, qualified, schema, table.properties, table.partition_by, soft, known
        )
        if state.exists:
            apply_table_settings(spark, qualified, state, table.properties, table.partition_by)
        present = {c.name for c in schema.columns}
        dropped = [n for n in lake_columns if n not in present]
        heal = _heal_of(batch.plan, table, state)
        props = _summary_properties(
            batch.plan.batch_id,
            new_offsets,
            records,
            resolved,
            state.truncate_applied,
            heal,
            batch.plan.cut,
        )
        # the snapshot the offsets were read from: a commit by anyone else since then
        # makes the fast-forward of the batch's branch (`_staged`) fail
        before_id = state.snapshot_id
        view = f"cdclake_changes_{table.target}"
        # hard deletes: a ledger of deleted keys keeps re-sent older changes out
        hard = bool(schema.key_names) and not soft
        rows = resolved.rows
        if moved is not None:  # key changes a later batch may need (`resolve.lineage`)
            record_key_changes(spark, qualified, moved.kept, schema)
        source = with_deleted_lsn(spark, qualified, rows, schema) if hard else rows
        source.createOrReplaceTempView(view)
        if hard and resolved.deletes:
            record_deleted_keys(spark, qualified, rows, schema)
        keyed = bool(schema.key_names)
        first_load = keyed and batch.tuning.first_load_append and state.empty and not dropped
        mode = (soft, hard, first_load)
        try:
            with committing(spark, qualified, before_id, batch.plan.batch_id, props) as commit:
                target = commit.target
                sql = _write_sql(batch.tuning, state, schema, resolved, view, target, dropped, mode)
                swept = _sweep(spark, target, heal, soft, keyed)
                if first_load:
                    append_to_empty(spark, target, sql, before_id)
                else:
                    spark.sql(sql)
        finally:
            spark.catalog.dropTempView(view)
        after_id = commit.snapshot_id
        if moved is not None:
            forget_key_changes(spark, qualified, moved.taken, schema)
    return after_id, WrittenBy.MERGE if keyed and not first_load else WrittenBy.APPEND, swept


def commit_heal(
    batch: Writing, table: TableConfig, state: TableState, offsets: dict[TopicPartition, int]
) -> tuple[int | None, int]:
    """A batch without records of `table` whose heal starts or sweeps
    (`cdclake_control.gaps`): the offsets and the heal committed, the sweep done. The
    snapshot id and the rows the sweep removed."""
    spark, qualified = batch.spark, batch.pipeline.qualified_target(table)
    heal = _heal_of(batch.plan, table, state)
    props = _summary_properties(
        batch.plan.batch_id, offsets, 0, None, state.truncate_applied, heal, batch.plan.cut
    )
    soft = table.delete_mode is DeleteMode.SOFT
    before_id = state.snapshot_id
    with committing(spark, qualified, before_id, batch.plan.batch_id, props) as commit:
        swept = _sweep(spark, commit.target, heal, soft, bool(state.key_names))
    return commit.snapshot_id, swept


def _heal_of(plan: BatchPlan, table: TableConfig, state: TableState) -> Heal | None:
    """The table's heal: the plan's, else the one its last commit carries (a backfill's
    plan has none), carried on."""
    heal = plan.heal.get(table.source)
    if heal is None and state.heal:
        heal = Heal.from_dict(json.loads(state.heal))
    return heal


def _sweep(spark: SparkSession, target: str, heal: Heal | None, soft: bool, keyed: bool) -> int:
    """When `heal` sweeps: remove the rows last written by a record below its marks, rows
    the source deleted during a retention gap (soft deletes mark them); how many. A table
    without a key is a changelog: its rows are changes, which stay."""
    if heal is None or not heal.sweep or not keyed:
        return 0
    below = " OR ".join(
        f"({PARTITION} = {int(p)} AND {OFFSET} < {int(o)})" for p, o in sorted(heal.marks.items())
    )
    gone = f"({below or 'false'})" + (f" AND NOT coalesce({DELETED}, false)" if soft else "")
    count = int(spark.sql(f"SELECT count(*) AS n FROM {target} WHERE {gone}").collect()[0].n)
    if count:
        change = f"UPDATE {target} SET {DELETED} = true" if soft else f"DELETE FROM {target}"
        spark.sql(f"{change} WHERE {gone}")
    log.warning(
        "%s: healed (snapshot %s): %d rows the source deleted during the gap removed",
        target,
        heal.signal_id,
        count,
    )
    return count


def _summary_properties(
    batch_id: str,
    offsets: dict[TopicPartition, int],
    records: int,
    resolved: Resolved | None,
    truncate_applied: int | None,
    heal: Heal | None,
    cut: Cut | None = None,
) -> dict[str, str]:
    """The snapshot summary a load's commit carries: its offsets, batch and figures, the
    last truncate applied (`truncate_applied`, or the batch's own) and the table's heal
    (`cdclake_control.gaps`). `resolved`: None when the batch had no record of the table."""
    props = {
        SUMMARY_OFFSETS: encode_offsets(offsets),
        SUMMARY_BATCH: batch_id,
        SUMMARY_RECORDS: str(records),
        SUMMARY_UPSERTS: str(resolved.upserts if resolved else 0),
        SUMMARY_DELETES: str(resolved.deletes if resolved else 0),
    }
    if resolved is not None and resolved.max_ms is not None:
        props[SUMMARY_SOURCE_TS] = str(resolved.max_ms)
    if heal is not None:
        props[SUMMARY_HEALED if heal.sweep else SUMMARY_HEAL] = json.dumps(heal.to_dict())
    if cut is not None:  # where the next consistent plan reads the transactions from
        props[SUMMARY_CUT] = cut.to_json()
    truncate = resolved.truncate if resolved else None
    lsns = [
        x
        for x in (truncate_applied, truncate.lsn if truncate is not None else None)
        if x is not None
    ]
    if lsns:
        props[SUMMARY_TRUNCATE] = str(max(lsns))
    return props


def _stage_name(batch_id: str) -> str:
    """`STAGE_PREFIX`, the time it is made (ms: maintenance removes it once older than the
    orphan bound, `stage_branches`), the batch."""
    return f"{STAGE_PREFIX}{time.time_ns() // 1_000_000}_" + re.sub(
        r"[^a-z0-9_]", "_", batch_id.lower()
    )


@dataclass
class Commit:
    """Where a load's writes go (`target`: a branch of the table), and once main took
    them the snapshot that carries the batch's offsets (`snapshot_id`)."""

    target: str
    snapshot_id: int | None = None


@contextmanager
def committing(
    spark: SparkSession,
    qualified: str,
    before_id: int | None,
    batch_id: str,
    props: Mapping[str, str],
) -> Iterator[Commit]:
    """Where a load writes (yielded): a branch of the table made at `before_id` (a table
    without a snapshot gets an empty one first) that main takes once the writes inside
    are done, its last commit carrying `props` (`_staged`). A classic session does the
    same through its JVM, faster (`jvm_commit`)."""
    if not is_connect(spark):
        stage = None if before_id is None else _stage_name(batch_id)
        target = qualified if stage is None else f"{qualified}.branch_{stage}"
        commit = Commit(target)
        with jvm_staged(spark, qualified, before_id, stage, props):
            yield commit
        commit.snapshot_id = jvm_check_commit(spark, qualified, before_id, props)
        return
    if before_id is None:
        commit_empty(spark, qualified, {})  # no offsets: as a table without snapshot
        before_id, _ = current_snapshot(spark, qualified)
        if before_id is None:
            raise CommitConflictError(f"{qualified}: dropped while this batch loaded. Plan again.")
    stage = _stage_name(batch_id)
    with _staged(spark, qualified, before_id, stage, props) as commit:
        yield commit


@contextmanager
def _staged(
    spark: SparkSession,
    qualified: str,
    before_id: int,
    name: str,
    props: Mapping[str, str],
) -> Iterator[Commit]:
    """The load's commits inside go to the branch `name` (`qualified.branch_<name>`), made
    at `before_id`; an empty commit carrying `props` ends it, and main takes it."""
    # another load's branch stays: it may be at work (a backfill beside a scheduled run);
    # a killed load's goes with maintenance (`_drop_dead_branches`)
    spark.sql(f"ALTER TABLE {qualified} CREATE BRANCH {name} AS OF VERSION {before_id}")
    removed = CommitConflictError(
        f"{qualified}: this batch's branch {name} was removed while it loaded (taken for "
        "a killed load's); nothing of the batch was committed. Plan again."
    )
    commit = Commit(f"{qualified}.branch_{name}")
    try:
        yield commit
        try:
            commit_empty(spark, qualified, props, branch=name)
        except Exception as exc:  # Iceberg refuses a write to a branch that is gone
            if "Cannot use branch" not in str(exc):
                raise
            raise removed from exc
        ice = lake_table(spark, qualified)
        if ice is None or not _made_by_batch(ice, name, before_id, props[SUMMARY_BATCH]):
            raise removed
        commit.snapshot_id = _fast_forward(spark, qualified, name, before_id)
    except BaseException:
        try:
            spark.sql(f"ALTER TABLE {qualified} DROP BRANCH IF EXISTS {name}")
        except Exception as exc:  # maintenance removes it
            log.warning("%s: branch %s not removed: %s", qualified, name, exc)
        raise


def _fast_forward(spark: SparkSession, qualified: str, name: str, before_id: int) -> int:
    """Main takes branch `name`, then the branch goes; refused when main is no longer at
    `before_id`'s line (another commit reached it). The snapshot main is at now."""
    catalog, _, identifier = qualified.partition(".")
    try:
        done = spark.sql(
            f"CALL {catalog}.system.fast_forward('{identifier}', 'main', '{name}')"
        ).collect()
    except Exception as exc:
        if "Cannot fast-forward" not in str(exc):
            raise
        raise CommitConflictError(
            f"{qualified}: another commit reached the table after snapshot {before_id}, "
            "which this batch's offsets were read from; nothing of the batch was "
            "committed. Plan again."
        ) from exc
    spark.sql(f"ALTER TABLE {qualified} DROP BRANCH IF EXISTS {name}")
    return int(done[0]["updated_ref"])


def _made_by_batch(ice: LakeTable, name: str, before_id: int, batch: str) -> bool:
    """Whether branch `name` ends with batch `batch`'s summary and holds no other batch's
    above snapshot `before_id`: what main may take."""
    ref = ice.metadata.refs.get(name)
    snapshot = None if ref is None else ice.snapshot_by_id(ref.snapshot_id)
    if snapshot is None or summary_of(snapshot).get(SUMMARY_BATCH) != batch:
        return False
    while snapshot is not None and snapshot.snapshot_id != before_id:
        if summary_of(snapshot).get(SUMMARY_BATCH, batch) != batch:
            return False
        parent = snapshot.parent_snapshot_id
        snapshot = None if parent is None else ice.snapshot_by_id(parent)
    return snapshot is not None


def _key_filter(
    state: TableState,
    schema: TopicSchema,
    resolved: DataFrame,
    truncate: Truncate | None,
    counts: Mapping[bool, int],
    tuning: Tuning,
) -> dict[str, Any] | None:
    """The values of each key column among the resolved rows, sorted, or the range of
    each integer key column's, when the MERGE is worth filtering by them (None: not)."""
    keys = schema.key
    changes = sum(counts.values())
    if truncate is not None or not keys or state.rows < tuning.key_filter_rows or changes <= 0:
        return None
    from pyspark.sql import functions as F

    if changes > tuning.key_filter_keys or any(k.type not in KEY_FILTER_TYPES for k in keys):
        integers = [k.name for k in keys if k.type in INTEGER_TYPES]
        if not integers:
            return None
        aggs = [f(F.col(f"`{n}`")) for n in integers for f in (F.min, F.max)]
        found = cast("Row", resolved.agg(*aggs).first())  # not None: an aggregate's one row
        if any(v is None for v in found):  # no key value at all
            return None
        return {n: KeyRange(found[2 * i], found[2 * i + 1]) for i, n in enumerate(integers)}
    rows = resolved.select(*(F.col(f"`{k.name}`") for k in keys)).collect()
    values = {}
    for i, k in enumerate(keys):
        # a NULL key matches nothing
        values[k.name] = sorted({r[i] for r in rows if r[i] is not None})
        if not values[k.name]:
            return None
    chars = sum(len(v) for vs in values.values() for v in vs if isinstance(v, str))
    if chars > tuning.key_filter_chars:
        return None
    try:
        key_filter_sql(schema, values)
    except ValueError:  # a text no SQL literal holds
        return None
    return values


def _write_sql(
    tuning: Tuning,
    state: TableState,
    schema: TopicSchema,
    resolved: Resolved,
    view: str,
    target: str,
    dropped: list[str],
    mode: tuple[bool, bool, bool],
) -> str:
    """The statement that writes the rows of `view` into `target`: the first load's query
    (a keyed table that holds no row takes only the MERGE's inserts: an append), the MERGE
    of a keyed table, or the append of a keyless one. `mode`: soft deletes, a deleted-keys
    ledger (hard deletes), the first load."""
    soft, hard, first_load = mode
    truncate = resolved.truncate
    lsns = (state.truncated_below, truncate.lsn if truncate is not None else None)
    below = max((x for x in lsns if x is not None), default=None)
    if first_load:
        return build_first_load_sql(view, schema, soft, deleted_lsn=hard, truncated_below=below)
    if not schema.key_names:
        return build_append_sql(target, view, schema, soft_delete=soft)
    # the columns whose placeholders may be left to the table: those with a flag
    flags = [n for n in resolved.rows.columns if n.startswith(TOAST_PREFIX)]
    toast_columns = [n.removeprefix(TOAST_PREFIX) for n in flags] if resolved.toast else []
    return build_merge_sql(
        target,
        view,
        schema,
        toast_columns,
        truncate=truncate,
        dropped_columns=dropped,
        soft_delete=soft,
        deleted_lsn=hard,
        truncated_below=below,
        key_values=_key_filter(state, schema, resolved.rows, truncate, resolved.counts, tuning),
    )
