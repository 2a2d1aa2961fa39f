"""The load job: read the planned offset ranges, resolve, MERGE, commit offsets with data.

Shared by `cdclake run` (in-process Spark) and `jobs/load.py` (spark-submit).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, cast

from cdclake.batch import Batch, LoadStatus, TableResult
from cdclake.config import PipelineConfig, TableConfig
from cdclake.debezium.schema import TopicSchema, topic_schema
from cdclake.exceptions import CdclakeError, CommitConflictError, ConfigError, DecodeError
from cdclake.iceberg.deleted_keys import deleted_keys_table
from cdclake.iceberg.history import (
    commit_history,
    history_before,
    history_state,
    history_table,
    written,
)
from cdclake.iceberg.key_changes import key_changes_table, read_key_changes
from cdclake.iceberg.tables import (
    TableState,
    current_snapshot,
    ensure_namespace,
    table_columns,
    table_state,
)
from cdclake.iceberg.tags import tag_consistent
from cdclake.iceberg.write import commit_heal, write_table
from cdclake.kafka.reader import DRIVER_READ_BYTES, KAFKA, RawSource, arrow_frame, read_local
from cdclake.kafka.scan import RawScan, scan_rows
from cdclake.kafka.topics import discover
from cdclake.offsets import (
    SUMMARY_BATCH,
    BatchPlan,
    OffsetRange,
    PlanMode,
    TopicPartition,
    utc_text,
)
from cdclake.placement import MEASURED, Placement, Tuning
from cdclake.ranged import FailedTopic, RangedTopic, read_by_range
from cdclake.resolve.history import history, lookups
from cdclake.resolve.lineage import Linked, linked
from cdclake.resolved import Resolved
from cdclake.resolving import history_changes, resolve_table
from cdclake.setaside import handle_broken_envelopes, set_aside_misfits
from cdclake.spark import (
    SMALL_BATCH_CONF,
    SMALL_BATCH_PARTITIONS,
    batch_settings,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


def run_batch(
    spark: SparkSession,
    pipeline: PipelineConfig,
    plan: BatchPlan,
    *,
    read: RawSource = KAFKA,
    placement: Placement = Placement.AUTO,
    tuning: Tuning = MEASURED,
) -> list[TableResult]:
    """Load one planned batch. `read` reads the raw records of the planned ranges; by
    default from Kafka (benchmarks pass recorded files instead). Where they are read
    and resolved follows `placement`'s rule, with `tuning`'s thresholds.

    The tables are loaded at the same time by up to `pipeline.parallel_tables` driver
    threads (each table commits on its own, with its own offsets). When a table fails,
    the others still load and commit; the run then fails with the first failed table's
    error (in the pipeline's order), which names it."""
    if not plan.ranges:
        return []
    pipeline = discover(pipeline, {r.topic for r in plan.ranges})
    if plan.mode == PlanMode.REBUILD:
        _drop_for_rebuild(spark, pipeline, plan)
    small = plan.total <= tuning.driver_read_records  # the pipeline's own settings win
    conf = {k: v for k, v in SMALL_BATCH_CONF.items() if small and k not in pipeline.spark.conf}
    with batch_settings(spark, conf) as before:
        return _run_batch(spark, pipeline, plan, read, before, placement, tuning)


def _run_batch(
    spark: SparkSession,
    pipeline: PipelineConfig,
    plan: BatchPlan,
    read: RawSource,
    before: Mapping[str, str | None],
    placement: Placement,
    tuning: Tuning,
) -> list[TableResult]:
    started = time.perf_counter()
    raw: DataFrame | None = None
    ranged: dict[str, RangedTopic | FailedTopic] = {}
    rows: pa.Table | None = None
    try:
        if placement.step(plan.total, tuning.driver_read_records) is Placement.DRIVER:
            rows = read_local(pipeline.kafka, plan.ranges, source=read)
            if rows is None:
                log.info(
                    "batch %s: more than %d MiB of records; read range by range",
                    plan.batch_id,
                    DRIVER_READ_BYTES >> 20,
                )
        set_aside: dict[str, int]  # per topic, its records that were not envelopes
        if rows is None:
            ranged = read_by_range(spark, pipeline, plan, read, tuning)
            scan, set_aside = RawScan({}, {}, {}), {}
        else:  # the records as a local relation (no Spark job, no Python worker to start)
            raw = arrow_frame(spark, rows).coalesce(SMALL_BATCH_PARTITIONS)
            raw, scan, set_aside = handle_broken_envelopes(
                spark, pipeline, plan, raw, scan_rows(rows)
            )
        ensure_namespace(spark, f"{pipeline.catalog.name}.{pipeline.namespace}")
        batch = Batch(
            spark,
            pipeline,
            plan,
            raw,
            scan,
            time.perf_counter() - started,
            rows,
            ranged,
            before,
            tuning,
            set_aside,
            read,
        )
        work = [t for t in pipeline.tables if batch.ranges_of(t)]
        results = _run_tables(work, partial(_load, batch), pipeline.parallel_tables, pipeline)
        if plan.cut is None:
            return results
        # every table committed: all of them at the one transaction (`iceberg.tags`)
        tag_consistent(spark, pipeline, plan.cut, {r.table: r.snapshot_id for r in results})
        return [dataclasses.replace(r, consistent=plan.cut.describe()) for r in results]
    finally:
        for topic in ranged.values():
            topic.release()


def _run_tables(
    tables: list[TableConfig],
    load: Callable[[TableConfig], TableResult],
    threads: int,
    pipeline: PipelineConfig,
) -> list[TableResult]:
    """Run `load` for every table, `threads` at a time; results in the tables' order.
    A failed table does not stop the others; the first failure (in order) is raised
    once every table is done."""
    from concurrent.futures import ThreadPoolExecutor

    workers = max(1, min(threads, len(tables)))
    if workers == 1:  # in this thread (same semantics; profilers see it)
        outcomes = [_outcome(load, t) for t in tables]
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="cdclake-load") as pool:
            futures = [pool.submit(_outcome, load, t) for t in tables]
        outcomes = [f.result() for f in futures]
    results: list[TableResult] = []
    failed: list[tuple[TableConfig, Exception]] = []
    for table, (result, exc) in zip(tables, outcomes, strict=True):
        if exc is None:
            results.append(cast(TableResult, result))  # not None: the load returned it
            continue
        log.error("%s: load failed: %s", pipeline.qualified_target(table), exc)
        failed.append((table, exc))
    if failed:
        table, exc = failed[0]
        others = [pipeline.qualified_target(t) for t, _ in failed[1:]]
        qualified, topic = pipeline.qualified_target(table), pipeline.topic_for(table)
        raise _naming(exc, qualified, topic, others)
    return results


def _outcome(
    load: Callable[[TableConfig], TableResult], table: TableConfig
) -> tuple[TableResult | None, Exception | None]:
    """(result, None) or (None, the exception): a failed table does not stop the others."""
    try:
        return load(table), None
    except Exception as exc:
        return None, exc


def _naming(exc: BaseException, qualified: str, topic: str, others: list[str]) -> BaseException:
    """The error of a failed table, saying which table (and which others failed too).
    cdclake's own errors keep their type; others get a note."""
    also = f" (also failed: {', '.join(others)})" if others else ""
    text = str(exc)
    if isinstance(exc, CdclakeError):
        if qualified in text or topic in text:
            if not also:
                return exc
            renamed = type(exc)(text + also)
        else:
            renamed = type(exc)(f"{qualified}: {text}{also}")
        renamed.__cause__ = exc
        return renamed
    exc.add_note(f"while loading {qualified}{also}")
    return exc


def _load(batch: Batch, table: TableConfig) -> TableResult:
    from pyspark.sql import functions as F

    topic = batch.pipeline.topic_for(table)
    if not any(r.size for r in batch.ranges_of(table)):  # only a heal's sweep
        return _sweep_only(batch, table)
    ranged = batch.ranged.get(topic)
    if isinstance(ranged, FailedTopic):
        raise ranged.error
    if ranged is not None:
        return _load_table(batch, table, None, ranged.accepted.schemas)
    if topic in batch.scan.broken:  # on_error: fail (dead letters were taken out)
        partition, offset, error = batch.scan.broken[topic]
        raise DecodeError(f"{topic} partition {partition} offset {offset}: {error}")
    # read by the driver: a topic not ranged is in it
    table_raw = cast("DataFrame", batch.raw).where(F.col("topic") == topic)
    return _load_table(batch, table, table_raw, batch.scan.schemas.get(topic, {}))


def _drop_for_rebuild(spark: SparkSession, pipeline: PipelineConfig, plan: BatchPlan) -> None:
    """Drop each table of a rebuild once: not when this backfill already committed to it
    (a retried or later batch of the same rebuild)."""
    topics = {r.topic for r in plan.ranges}
    for table in pipeline.tables:
        qualified = pipeline.qualified_target(table)
        if pipeline.topic_for(table) not in topics or not spark.catalog.tableExists(qualified):
            continue
        _, summary = current_snapshot(spark, qualified)
        last = (summary or {}).get(SUMMARY_BATCH, "")
        if last.startswith(plan.run_prefix + "/"):
            continue
        log.warning("%s: dropped for rebuild %s", qualified, plan.run_prefix)
        spark.sql(f"DROP TABLE {qualified} PURGE")
        ledgers = (deleted_keys_table(qualified), key_changes_table(qualified))
        for ledger in (*ledgers, history_table(qualified)):
            spark.sql(f"DROP TABLE IF EXISTS {ledger} PURGE")


def _healed_gaps(
    plan: BatchPlan, table: TableConfig, committed: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """The committed offsets, those of a gap the plan heals (`cdclake_control.gaps`) at
    the log start the plan goes on from."""
    out = dict(committed)
    heal = plan.heal.get(table.source)
    for p, first, low in heal.lost if heal is not None else ():
        for tp in [tp for tp in committed if tp[1] == p and committed[tp] == first]:
            out[tp] = low
    return out


def _check_plan_start(
    qualified: str,
    committed: dict[TopicPartition, int],
    ranges: list[OffsetRange],
    plan: BatchPlan,
    table: TableConfig,
) -> bool:
    """True when an earlier attempt of this batch already committed it; raise when another
    run moved the table's offsets since the plan was made."""
    ends = {(r.topic, r.partition): r.end for r in ranges}
    if all(committed.get(tp) == end for tp, end in ends.items()):
        return True
    _check_not_moved(qualified, _healed_gaps(plan, table, committed), ranges)
    return False


def _check_not_moved(
    qualified: str, committed: dict[TopicPartition, int], ranges: list[OffsetRange]
) -> None:
    """Raise when another run moved the table's offsets since the plan was made."""
    starts = {(r.topic, r.partition): r.start for r in ranges}
    moved = {tp: c for tp in starts if (c := committed.get(tp)) is not None and c != starts[tp]}
    if moved:
        expected = {tp: starts[tp] for tp in moved}
        raise CommitConflictError(
            f"{qualified}: committed offsets {moved} differ from the plan's start {expected}; "
            "another run loaded this table meanwhile. Nothing was written; plan again."
        )


def _linked(
    spark: SparkSession, qualified: str, schema: TopicSchema, state: TableState, resolved: Resolved
) -> tuple[Resolved, Linked | None]:
    """The resolved rows with their key lineage followed (`cdclake.resolve.lineage`), and
    what it leaves to the write (the key changes to keep and those taken; None: no key
    lineage to follow)."""
    if not (resolved.toast and schema.key_names):
        return resolved, None
    lake = spark.table(qualified) if state.exists else None
    found = linked(resolved.rows, schema, lake, lambda: read_key_changes(spark, qualified))
    persisted = resolved.rows if resolved.cached is None else resolved.cached
    linked_rows = dataclasses.replace(resolved, rows=found.rows, cached=persisted)
    return linked_rows, found


def _load_table(
    batch: Batch,
    table: TableConfig,
    raw: DataFrame | None,
    schemas: dict[str, list[tuple[int, str]]],
) -> TableResult:
    spark, pipeline, plan = batch.spark, batch.pipeline, batch.plan
    ranges = batch.ranges_of(table)
    qualified = pipeline.qualified_target(table)
    topic = pipeline.topic_for(table)
    records = sum(r.size for r in ranges)
    seconds = {"read": round(batch.read_seconds, 3)}
    done = partial(TableResult, table=qualified, topic=topic, records=records, seconds=seconds)
    clock = _Clock(seconds)
    state = table_state(spark, qualified)
    batch.compile_for(qualified, state.rows)
    committed = state.committed
    ends = {(r.topic, r.partition): r.end for r in ranges}
    if plan.mode == PlanMode.REPLAY:
        # re-applied records never regress newer rows (LSN check in the MERGE), and the
        # committed offsets never move backwards
        ends = {tp: max(end, committed.get(tp, 0)) for tp, end in ends.items()}
    elif _check_plan_start(qualified, committed, ranges, plan, table):
        log.info("%s: batch %s was already committed", qualified, plan.batch_id)
        return done(status=LoadStatus.ALREADY_COMMITTED)
    known = table_columns(spark, qualified) if state.exists else {}
    # not a failed topic: `_load` raised its error
    ranged = cast("RangedTopic | None", batch.ranged.get(topic))
    if ranged is not None and known != ranged.known:
        raise CommitConflictError(
            f"{qualified}: another run changed the table's columns while this batch was "
            "resolved; nothing was written. Plan again."
        )
    schemas, raw, misfits = set_aside_misfits(batch, table, topic, schemas, known, raw)
    misfits += batch.set_aside.get(topic, 0)  # records that were not envelopes
    if not schemas.get("value") and not state.exists:
        log.info("%s: only tombstones for a table that does not exist yet; skipped", qualified)
        return done(status=LoadStatus.SKIPPED, dead_letters=misfits)
    # a batch whose records carry no key (only truncates) keeps the key the table has
    key = table.key or (() if schemas.get("key") else state.key_names)
    schema = topic_schema(
        [s for _, s in schemas.get("key", [])],
        [s for _, s in schemas.get("value", [])],
        key,
        topic,
        table.exclude,
        known,
        batch.pipeline.kafka.format,
    )
    clock.lap("state")
    resolved = resolve_table(batch, topic, table, schema, schemas, state.truncate_applied)
    resolved, moved = _linked(spark, qualified, schema, state, resolved)
    if table.history:  # before the table: a failed table's batch is written again
        _history(batch, table, schema, schemas, ends, state, resolved)
    clock.lap("resolve")
    new_offsets = {**committed, **ends}
    try:
        after_id, written_by, swept = write_table(
            batch, table, schema, state, known, new_offsets, resolved, records, moved
        )
    finally:
        resolved.release()
    clock.lap("write")
    counts = (records, resolved.upserts, resolved.deletes, after_id)
    log.info("%s: committed %d records (%d upserts, %d deletes) in snapshot %s", qualified, *counts)
    return done(
        status=LoadStatus.COMMITTED,
        upserts=resolved.upserts,
        deletes=resolved.deletes,
        dead_letters=misfits + resolved.dead_letters,
        offsets=_by_topic(new_offsets),
        truncated=resolved.truncate is not None,
        resolved_by=resolved.by,
        written_by=written_by,
        snapshot_id=after_id,
        heal=_healing(plan, table, swept),
    )


def _history(
    batch: Batch,
    table: TableConfig,
    schema: TopicSchema,
    schemas: dict[str, list[tuple[int, str]]],
    ends: dict[TopicPartition, int],
    current: TableState,
    resolved: Resolved,
) -> None:
    """Write the batch's versions into the table's history (`cdclake.iceberg.history`);
    `current`: the table's state, `resolved`: its resolve's."""
    qualified = batch.pipeline.qualified_target(table)
    if not schema.key_names:
        raise ConfigError(
            f"{qualified}: history needs a key, and the table has none (its rows are already "
            "a changelog); set the table's `key`, or turn history off"
        )
    known = {c.name for c in schema.columns}
    unknown = [c for c in table.history_columns if c not in known]
    if unknown:
        raise ConfigError(
            f"{qualified}: history_columns {unknown} are not columns of the table "
            f"(its columns: {', '.join(sorted(known))})"
        )
    spark = batch.spark
    state = history_state(spark, qualified, schema, table.properties, current)
    if written(state, ends):
        return
    changes = history_changes(batch, batch.pipeline.topic_for(table), schema, schemas, resolved)
    before = history_before(spark, qualified, schema, lookups(changes, schema), state)
    changed = history(changes, schema, before, table.history_columns)
    commit_history(spark, qualified, schema, state, changed, ends, batch.plan.batch_id)


def _healing(plan: BatchPlan, table: TableConfig, swept: int) -> str | None:
    """What the run report says of the table's retention gap (`cdclake_control.gaps`)."""
    heal = plan.heal.get(table.source)
    if heal is None:
        return None
    if heal.sweep:
        return f"healed: snapshot {heal.signal_id} done, {swept} rows deleted in the gap removed"
    lost = ", ".join(f"partition {p} offsets {a}..{b - 1}" for p, a, b in heal.lost)
    since = utc_text(heal.since_ms)
    return f"healing since {since}: snapshot {heal.signal_id} re-reads it ({lost} lost)"


def _sweep_only(batch: Batch, table: TableConfig) -> TableResult:
    """A table without records in the batch whose heal starts or sweeps
    (`cdclake_control.gaps`): its offsets and heal committed, the sweep done."""
    qualified = batch.pipeline.qualified_target(table)
    state = table_state(batch.spark, qualified)
    ranges = batch.ranges_of(table)
    topic = batch.pipeline.topic_for(table)
    # no "already committed" check: empty ranges end where they start (a retry sweeps and
    # commits again, which changes nothing)
    _check_not_moved(qualified, _healed_gaps(batch.plan, table, state.committed), ranges)
    offsets = {**state.committed, **{(r.topic, r.partition): r.end for r in ranges}}
    after_id, swept = commit_heal(batch, table, state, offsets)
    return TableResult(
        table=qualified,
        topic=topic,
        status=LoadStatus.COMMITTED,
        offsets=_by_topic(offsets),
        snapshot_id=after_id,
        heal=_healing(batch.plan, table, swept),
    )


def _by_topic(offsets: Mapping[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    """Offsets by topic, then partition (as text), as the run report shows them."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


class _Clock:
    """Seconds per stage into `seconds`: each `lap` takes the time since the last one."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds, self.last = seconds, time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(now - self.last, 3)
        self.last = now
