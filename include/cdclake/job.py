"""The load job: read the planned offset ranges, resolve, MERGE, commit offsets with data.

Shared by `cdclake run` (in-process Spark) and `jobs/load.py` (spark-submit).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

from cdclake.changes import (
    DELETED,
    SOURCE_TS,
    TopicSchema,
    column_types,
    decode_changes,
    misfit,
    topic_schema,
    value_row_fields,
)
from cdclake.config import DeleteMode, OnError, PipelineConfig, TableConfig
from cdclake.debezium import parse_connect_schema
from cdclake.driver_resolve import (
    RAW_COLUMNS,
    TASK_RECORDS,
    UNSUPPORTED_MARK,
    DriverResolved,
    Unsupported,
    resolve_rows,
    resolve_task,
    task_ddl,
    tasks_can_resolve,
)
from cdclake.exceptions import CdclakeError, CommitConflictError, ConfigError, DecodeError
from cdclake.kafka import discover, raw_records
from cdclake.leases import Leases
from cdclake.merge import (
    DEAD_LETTER_RAW,
    DEAD_LETTERS,
    INTEGER_TYPES,
    KEY_FILTER_TYPES,
    KeyRange,
    TableState,
    append_to_empty,
    apply_table_settings,
    build_append_sql,
    build_first_load_sql,
    build_merge_sql,
    commit_empty,
    commit_properties,
    conflicts_reported,
    current_snapshot,
    deleted_keys_table,
    ensure_namespace,
    ensure_table,
    key_filter_sql,
    mark_truncated,
    record_deleted_keys,
    table_columns,
    table_state,
    with_deleted_lsn,
    write_dead_letters,
)
from cdclake.offsets import (
    SUMMARY_BATCH,
    SUMMARY_DELETES,
    SUMMARY_OFFSETS,
    SUMMARY_RECORDS,
    SUMMARY_SOURCE_TS,
    SUMMARY_UPSERTS,
    BatchPlan,
    OffsetRange,
    PlanMode,
    TopicPartition,
    encode_offsets,
)
from cdclake.placement import Placement
from cdclake.range_resolve import (
    KEYS_COLUMN,
    META_COLUMN,
    AcceptedTopic,
    RangeSummary,
    TopicPlan,
    accept,
    head_schemas,
    range_task,
)
from cdclake.reader import (
    DRIVER_READ_BYTES,
    KAFKA,
    RawSource,
    arrow_frame,
    range_plan,
    read_local,
)
from cdclake.resolve import (
    CHECK_FIRST_TYPE,
    CHECK_TRUNCATE_TYPE,
    REASON,
    Truncate,
    changelog,
    check_aggregates,
    check_changes,
    invalid_reason,
    read_check,
    resolve_latest,
    toastable,
)
from cdclake.scan import RawScan, scan_raw, scan_rows
from cdclake.spark import (
    COMPILE_TARGET_ROWS,
    SMALL_BATCH_PARTITIONS,
    SMALL_BATCH_RECORDS,
    batch_conf,
    batch_settings,
    cache_level,
    restore_settings,
)

log = logging.getLogger(__name__)


@dataclass
class TableResult:
    table: str
    topic: str
    status: str  # committed | already_committed | skipped
    records: int = 0
    upserts: int = 0
    deletes: int = 0
    dead_letters: int = 0
    truncated: bool = False
    offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    # where the changes were decoded and resolved: "driver" (a small batch, in Python),
    # "tasks" (the same Python code in Spark tasks, records grouped by key) or "spark"
    # (Spark SQL jobs); empty when the table had nothing to load
    resolved_by: str = ""
    # how the rows were written: "merge", or "append" (a table without a key, or a keyed
    # table that held no row, as on a first load: the MERGE's inserts alone, without its
    # join); empty when nothing was
    written_by: str = ""
    snapshot_id: int | None = None
    # where the time went, in seconds: `read` (the batch's read and raw scan, shared by
    # its tables), then this table's `state` (table state and schema check), `resolve`
    # (decode, check, resolve) and `write` (table DDL, deleted-keys ledger, MERGE or append,
    # commit)
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def run_batch(
    spark, pipeline: PipelineConfig, plan: BatchPlan, *, read: Callable | None = None,
    placement: Placement = Placement.AUTO,
) -> list[TableResult]:  # fmt: skip
    """Load one planned batch. `read` makes the raw records DataFrame of the planned
    ranges; by default they come from Kafka (benchmarks pass a recorded file instead).
    Where they are read and resolved follows `placement`'s rule.

    The tables are loaded at the same time by up to `pipeline.parallel_tables` driver
    threads (each table commits on its own, with its own offsets). When a table fails,
    the others still load and commit; the run then fails with the first failed table's
    error (in the pipeline's order), which names it."""
    if plan.mode not in PlanMode.ALL:
        raise ConfigError(f"batch {plan.batch_id}: unknown plan mode {plan.mode!r}")
    if not plan.ranges:
        return []
    pipeline = discover(pipeline, {r.topic for r in plan.ranges})
    if plan.mode == PlanMode.REBUILD:
        _drop_for_rebuild(spark, pipeline, plan)
    conf = batch_conf(sum(r.size for r in plan.ranges), pipeline.spark.conf)
    with batch_settings(spark, conf) as before:
        return _run_batch(spark, pipeline, plan, read, before, placement)


def _run_batch(spark, pipeline: PipelineConfig, plan: BatchPlan, read: Callable | None,
               before: Mapping[str, str | None], placement: Placement):  # fmt: skip
    started = time.perf_counter()
    leases = Leases(spark)  # taken on each table before its data files are written
    try:
        ranged = _read_by_range(spark, pipeline, plan, read, placement)
    except BaseException:
        leases.close()
        raise
    rest = dataclasses.replace(plan, ranges=tuple(r for r in plan.ranges if r.topic not in ranged))
    raw = None
    try:
        if rest.ranges:
            raw, scan, rows = _read(spark, pipeline, rest, read, placement)
            raw, scan = _handle_broken_envelopes(spark, pipeline, plan, raw, scan, leases)
        else:
            scan, rows = RawScan({}, {}, 0), None
        ensure_namespace(spark, f"{pipeline.catalog.name}.{pipeline.namespace}")
        batch = _Batch(spark, pipeline, plan, raw, scan, time.perf_counter() - started, rows,
                       ranged, before, leases, placement)  # fmt: skip
        work = [t for t in pipeline.tables if batch.ranges_of(t)]
        return _run_tables(work, batch.load, pipeline.parallel_tables, pipeline)
    finally:
        if raw is not None:
            raw.unpersist()
        for topic in ranged.values():
            topic.release()
        leases.close()


def ranged_cache_level():
    """The storage level of a topic's rows resolved range by range: in memory, spilled
    to disk when storage memory runs short. A cached block is built whole before it can
    spill, which is why a big batch's raw records are cached on disk only
    (`cache_level`); here a block is one range's rows, at most `range_resolve.RANGE_KEYS`
    (~1 KB each from the connector), whatever the batch's size. A 1M-event batch took
    1.2 s less cold than with its rows on disk (side by side)."""
    from pyspark import StorageLevel

    return StorageLevel.MEMORY_AND_DISK


@dataclass
class _RangedTopic:
    """A topic of the batch read and resolved range by range: what its ranges added up
    to, its resolved rows (of `frame`, the range job's output, persisted), and the lake
    columns they were resolved for."""

    accepted: AcceptedTopic
    rows: object
    known: Mapping[str, str]
    frame: object

    def release(self) -> None:
        self.frame.unpersist()


@dataclass(frozen=True)
class _FailedTopic:
    """A topic whose ranges' read or resolve failed (a task, the read of their head):
    its table's load fails with that error, the other tables load. Nothing reads it
    again another way: Spark retried the task already, and the next run tries again."""

    error: Exception

    def release(self) -> None:
        pass


def _read_by_range(spark, pipeline: PipelineConfig, plan: BatchPlan, read: Callable | None,
                   placement: Placement):  # fmt: skip
    """The topics read and resolved range by range, or whose ranges failed ({} when
    none is): the driver reads
    the head of each eligible topic's ranges for its schemas (all at once, while it
    looks the lake tables up), then for each topic (as many at a time as tables are
    loaded) one Spark job reads its ranges, a task each, and resolves them into typed
    rows, kept when they add up (`_ranged_topic`)."""
    source = KAFKA if read is None else read
    records = plan.total
    if (not placement.by_range or not isinstance(source, RawSource)
            or placement.driver_reads(records, read is None)):  # fmt: skip
        return {}
    topics = {r.topic for r in plan.ranges}
    tables = {pipeline.topic_for(t): t for t in pipeline.tables}
    eligible = [topic for topic in tables if topic in topics]
    if not eligible:
        return {}
    reader = source.open(pipeline.kafka)
    ranges_of = {topic: [r for r in plan.ranges if r.topic == topic] for topic in eligible}
    # the heads of the ranges are read while the lake tables are looked up (a cold
    # catalog's first lookups take a second or two)
    from concurrent.futures import ThreadPoolExecutor

    threading.Thread(target=start_python_workers, args=(spark,), daemon=True).start()
    with ThreadPoolExecutor(len(eligible)) as pool:
        heads = {topic: pool.submit(_head_read, reader, ranges_of[topic]) for topic in eligible}
        work = {}
        for topic in eligible:
            qualified = pipeline.qualified_target(tables[topic])
            exists = spark.catalog.tableExists(qualified)
            work[topic] = (tables[topic], table_columns(spark, qualified) if exists else {})
        if not all(known for _, known in work.values()):  # created while ranges resolve
            ensure_namespace(spark, f"{pipeline.catalog.name}.{pipeline.namespace}")
    done: dict[str, _RangedTopic | _FailedTopic] = {}

    def resolve(topic: str) -> None:
        table, known = work[topic]
        frame = creating = created = planned = None
        try:
            planned = _topic_plan(heads[topic], table, topic, known)
            if planned is None:
                return
            topic_plan, ddl = planned
            new = not known and topic_plan.value_schema is not None
            if new:
                creating = ThreadPoolExecutor(1)
                created = creating.submit(_create_table, spark, pipeline, table,
                                          topic_plan.schema)  # fmt: skip
            level = (ranged_cache_level() if topic_plan.schema.key_names
                     # a changelog: a row per record, not per key
                     else cache_level(sum(r.size for r in ranges_of[topic])))  # fmt: skip
            frame = (
                range_plan(spark, ranges_of[topic])
                .mapInArrow(range_task(reader, {topic: topic_plan}), ddl)
                .persist(level)
            )
            got = _ranged_topic(frame, topic_plan)
        except CdclakeError:  # the rows do not add up: nothing of the batch is written
            if frame is not None:
                frame.unpersist()
            raise
        except Exception as exc:  # a read, a task, a bug: its table fails with the error
            log.error("%s: its ranges failed: %s", topic, _brief(exc))
            if frame is not None:
                frame.unpersist()
            done[topic] = _FailedTopic(exc)
            return
        finally:
            if creating is not None:
                creating.shutdown()
        if got is not None and creating is not None:
            try:  # the rows were typed for the columns it was created with
                got = dataclasses.replace(got, known=created.result())
            except CdclakeError:
                frame.unpersist()
                raise
            except Exception as exc:  # the load creates it, or fails, as for any table
                log.warning("%s: its table could not be created while its ranges resolved: "
                            "%s", topic, _headline(exc))  # fmt: skip
        if got is not None:
            done[topic] = got
        elif frame is not None:
            frame.unpersist()

    try:
        _each(list(work), resolve, pipeline.parallel_tables)
    except BaseException:
        for topic in done.values():
            topic.release()
        raise
    return done


def _create_table(spark, pipeline: PipelineConfig, table: TableConfig,
                  schema: TopicSchema) -> dict[str, str]:  # fmt: skip
    """Create the lake table of a topic whose ranges resolve meanwhile (on a cold JVM
    a creation takes a second or more, while the range tasks keep the cores busy in
    Python); its columns. The load then finds it as a table that holds no row. Errors
    are raised where the table's load would raise them."""
    qualified = pipeline.qualified_target(table)
    with conflicts_reported(
        f"{qualified}: another run created or changed this table at the same time; this "
        "run's batch was not committed to it. Plan again."
    ):
        ensure_table(spark, qualified, schema, table.properties, table.partition_by,
                     table.delete_mode is DeleteMode.SOFT, existing={})  # fmt: skip
    return table_columns(spark, qualified)


WORKERS_JOB_GROUP = "cdclake-python-workers"


def start_python_workers(spark) -> list[int]:
    """Start the Python workers of the executors' cores and import the range tasks'
    modules in them, while the driver looks the lake tables up and reads the heads (a
    job of one task per core; Spark keeps the workers for the tasks after it). A cold
    worker's start and imports otherwise fall on the first range tasks. The job is a
    `mapInArrow` as the range tasks are: Spark keeps a pool of workers per environment,
    and an RDD job's workers get another environment than a DataFrame's Arrow tasks.
    Returns the workers' process ids. Best effort: a failure is logged and the range
    tasks start their workers themselves."""
    sc = spark.sparkContext
    names = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
    try:
        cores = max(1, sc.defaultParallelism)
        kept = {name: sc.getLocalProperty(name) for name in names}
        sc.setJobGroup(WORKERS_JOB_GROUP, "start the Python workers for the range tasks")
        try:
            started = (spark.range(0, cores, 1, cores)
                       .mapInArrow(_import_range_modules, "pid long").collect())  # fmt: skip
        finally:  # this thread's later jobs are not of the group
            for name, value in kept.items():
                sc.setLocalProperty(name, value)
        return sorted({row.pid for row in started})
    except Exception as exc:
        log.info("the Python workers were not started ahead of the range tasks: %s",
                 _brief(exc))  # fmt: skip
        return []


def _import_range_modules(batches):
    import os

    import numpy  # noqa: F401
    import pyarrow as pa
    import pyarrow.compute  # noqa: F401

    import cdclake.range_resolve  # noqa: F401

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"pid": [os.getpid()]}, pa.schema([("pid", pa.int64())]))


def _head_read(reader, ranges: list[OffsetRange]):
    """`head_schemas` of the ranges."""
    heads = [{"topic": r.topic, "partition": r.partition, "start": r.start, "end": r.end}
             for r in ranges]  # fmt: skip
    return head_schemas(reader, heads)


def _topic_plan(head, table: TableConfig, topic: str,
                known: dict[str, str]) -> tuple[TopicPlan, str] | None:  # fmt: skip
    """The plan of a topic's range tasks, with the schemas at the head of its ranges
    (`head`, the future of its `_head_read`: a read that failed raises), and the schema
    of their rows; None (the log says why) when the topic must take the general path."""
    found = head.result()
    why = None
    if found is None:
        why = "no schema at the head of its ranges"
    else:
        schemas = {"key": [found[0]] if found[0] else [], "value": [found[1]] if found[1] else []}
        if _misfits(table, topic, schemas, known):
            why = "a schema that does not fit the table's columns"
        else:
            topic_plan = TopicPlan(topic, found[0], found[1], tuple(table.exclude), known,
                                   tuple(table.key))  # fmt: skip
            try:
                return topic_plan, topic_plan.ddl
            except CdclakeError as exc:  # a schema the lake cannot take
                why = str(exc)
    log.info("%s: read again the general way: %s", topic, why)
    return None


def _ranged_topic(frame, plan: TopicPlan):
    """A topic's range results (`frame`, persisted) -> its rows, or None (the log says
    why) when it must take the general path."""
    import numpy as np
    from pyspark.sql import functions as F

    topic = plan.topic
    meta = F.col(f"`{META_COLUMN}`")
    # the ranges' summaries and the count of their rows, in one job over the cached frame
    ends = F.struct(meta.alias("summary"), F.col(f"`{KEYS_COLUMN}`").alias("hashes"))
    [found] = frame.agg(F.collect_list(F.when(meta.isNotNull(), ends)).alias("ends"),
                        F.count(F.when(meta.isNull(), 1)).alias("rows")).collect()  # fmt: skip
    summaries = [RangeSummary.from_json(r.summary) for r in found.ends]
    hashes = [np.frombuffer(r.hashes or b"", dtype=np.uint64) for r in found.ends]
    try:
        got = accept(summaries, plan, hashes)
    except CdclakeError as exc:
        got = str(exc)
    if isinstance(got, str):
        log.info("%s: read again the general way: %s", topic, got)
        return None
    rows = frame.where(meta.isNull()).select(*(F.col(f"`{n}`") for n, _ in got.columns))
    total, resolved = found.rows, sum(got.counts.values())
    if total != resolved:
        raise CdclakeError(f"{topic}: the ranges resolved {resolved} rows but returned "
                           f"{total}; nothing was written")  # fmt: skip
    return _RangedTopic(got, rows, plan.known, frame)


def _headline(exc: BaseException, limit: int = 500) -> str:
    """An error's type and first line (an analysis error's last lines are a schema)."""
    first = (str(exc).strip().splitlines() or [""])[0][:limit]
    return f"{type(exc).__name__}: {first}"


def _brief(exc: BaseException, limit: int = 500) -> str:
    """An error's text for one log line: its last line that is not a stack frame (a
    Spark job's error ends with the task's own), cut to `limit` characters."""
    lines = [line.strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line and not line.startswith(("at ", "..."))]
    text = lines[-1] if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _each(items: list, fn: Callable, threads: int) -> None:
    """`fn` of every item, `threads` at a time; the first error is raised once all ran."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, min(threads, len(items) or 1))) as pool:
        futures = [pool.submit(fn, item) for item in items]
    for f in futures:
        f.result()


def _read(spark, pipeline: PipelineConfig, plan: BatchPlan, read: Callable | None,
          placement: Placement):  # fmt: skip
    """The batch's raw records, their scan, and the records as the driver holds them
    (an Arrow table, or None).

    A small batch from Kafka is read by the driver: its rows become a local relation
    (no Spark job, no Python worker to start) and are scanned in Python. Otherwise the
    records are read by Spark tasks (or by `read`), cached, and scanned by a Spark job."""
    records = sum(r.size for r in plan.ranges)
    if placement.driver_reads(records, read is None):
        rows = read_local(pipeline.kafka, plan.ranges)
        if rows is not None:
            raw = arrow_frame(spark, rows).coalesce(SMALL_BATCH_PARTITIONS)
            return raw, scan_rows(rows), rows
        log.info("batch %s: more than %d MiB of records; read by Spark tasks",
                 plan.batch_id, DRIVER_READ_BYTES >> 20)  # fmt: skip
    raw = (read or KAFKA)(spark, pipeline.kafka, plan.ranges)
    if records <= SMALL_BATCH_RECORDS:
        raw = raw.coalesce(SMALL_BATCH_PARTITIONS)
    raw = raw.persist(cache_level(records))
    try:
        return raw, scan_raw(raw), None
    except BaseException:
        raw.unpersist()
        raise


def _run_tables(
    tables: list[TableConfig], load: Callable[[TableConfig], TableResult], threads: int,
    pipeline: PipelineConfig,
) -> list[TableResult]:  # fmt: skip
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
    results, failed = [], []
    for table, (result, exc) in zip(tables, outcomes, strict=True):
        if exc is None:
            results.append(result)
            continue
        log.error("%s: load failed: %s", pipeline.qualified_target(table), exc)
        failed.append((table, exc))
    if failed:
        table, exc = failed[0]
        others = [pipeline.qualified_target(t) for t, _ in failed[1:]]
        qualified, topic = pipeline.qualified_target(table), pipeline.topic_for(table)
        raise _naming(exc, qualified, topic, others)
    return results


def _outcome(load: Callable[[TableConfig], TableResult], table: TableConfig):
    """(result, None) or (None, the exception): a failed table does not stop the others."""
    try:
        return load(table), None
    except Exception as exc:
        return None, exc


def _naming(exc: BaseException, qualified: str, topic: str, others: list[str]):
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


class _Batch:
    """What the tables of one batch share: the session, the raw records and their scan,
    and a lock for the dead-letter table every table writes to."""

    def __init__(
        self, spark, pipeline: PipelineConfig, plan: BatchPlan, raw, scan: RawScan,
        read_seconds: float, rows=None,
        ranged: dict[str, _RangedTopic | _FailedTopic] | None = None,
        before: Mapping[str, str | None] | None = None, leases: Leases | None = None,
        placement: Placement = Placement.AUTO,
    ) -> None:  # fmt: skip
        self.spark, self.pipeline, self.plan, self.raw, self.scan = spark, pipeline, plan, raw, scan
        self.placement = placement
        self.leases = leases or Leases(spark)  # write leases of the batch's tables
        self.rows = rows  # the raw records as an Arrow table, when the driver read them
        self.ranged = ranged or {}  # topics read and resolved range by range (not in `raw`)
        self.read_seconds = read_seconds  # reading the raw records and their scan
        self.dead_letter_lock = threading.Lock()
        # the session settings a small batch changed (`batch_conf`), with their values
        # before it: put back by `compile_for`
        self.interpreted = dict(before or {})
        self.settings_lock = threading.Lock()

    def compile_for(self, table: str, target_rows: int) -> None:
        """Compile the batch's expressions from now on (the settings before the batch
        back) when `table`, a MERGE target of `target_rows` rows, is big enough that
        its scan costs more interpreted than compiling does (`COMPILE_TARGET_ROWS`).
        One way only, so the tables loading meanwhile never switch back; what a query
        computes is the same either way."""
        if target_rows <= COMPILE_TARGET_ROWS or not self.interpreted:
            return
        with self.settings_lock:
            if not self.interpreted:
                return
            restore_settings(self.spark, self.interpreted)
            self.interpreted = {}
        log.info("%s: a MERGE target of %d rows; the batch's expressions are compiled from "
                 "now on", table, target_rows)  # fmt: skip

    def ranges_of(self, table: TableConfig) -> list[OffsetRange]:
        topic = self.pipeline.topic_for(table)
        return [r for r in self.plan.ranges if r.topic == topic]

    def load(self, table: TableConfig) -> TableResult:
        from pyspark.sql import functions as F

        topic = self.pipeline.topic_for(table)
        if isinstance(self.ranged.get(topic), _FailedTopic):
            raise self.ranged[topic].error
        if topic in self.ranged:
            schemas = self.ranged[topic].accepted.schemas
            return _load_table(self, table, self.ranges_of(table), None, schemas)
        if topic in self.scan.broken:  # on_error: fail (dead letters were taken out)
            partition, offset, error = self.scan.broken[topic]
            raise DecodeError(f"{topic} partition {partition} offset {offset}: {error}")
        table_raw = self.raw.where(F.col("topic") == topic)
        return _load_table(
            self, table, self.ranges_of(table), table_raw, self.scan.schemas.get(topic, {})
        )

    def dead_letters(self, rows, count: int) -> int:
        with self.dead_letter_lock:  # concurrent commits to the one table would conflict
            return _dead_letters(self.spark, self.pipeline, self.plan, rows, count,
                                 self.leases)  # fmt: skip


def _drop_for_rebuild(spark, pipeline: PipelineConfig, plan: BatchPlan) -> None:
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
        spark.sql(f"DROP TABLE IF EXISTS {deleted_keys_table(qualified)} PURGE")


def _handle_broken_envelopes(
    spark, pipeline: PipelineConfig, plan: BatchPlan, raw, scan: RawScan, leases: Leases
) -> tuple[object, RawScan]:
    """Records that are not JSON-with-schema envelopes: dead-letter them (and take them
    out of the batch), or leave them in `scan.broken` to fail their tables."""
    from pyspark.sql import functions as F

    if pipeline.on_error is not OnError.DEAD_LETTER or not scan.broken_count:
        return raw, scan
    dead = raw.where(F.col("error").isNotNull()).select(
        "topic", "partition", "offset",
        F.col("key_payload").alias("key"), F.col("value_payload").alias("value"), "error",
    )  # fmt: skip
    _dead_letters(spark, pipeline, plan, dead, scan.broken_count, leases)
    return raw.where(F.col("error").isNull()), dataclasses.replace(scan, broken={})


def _dead_letters(spark, pipeline: PipelineConfig, plan: BatchPlan, rows, count: int,
                  leases: Leases) -> int:  # fmt: skip
    from pyspark.sql import functions as F

    stamped = _with_raw(spark, pipeline, rows).select(
        F.lit(pipeline.name).alias("pipeline"),
        F.lit(plan.batch_id).alias("batch_id"),
        "topic", "partition", "offset", "key", "value", "error",
        F.current_timestamp().alias("recorded_at"), "raw_key", "raw_value", "headers",
    )  # fmt: skip
    namespace = f"{pipeline.catalog.name}.{pipeline.namespace}"
    ensure_namespace(spark, namespace)
    dead = f"{namespace}.{DEAD_LETTERS}"
    # leased once it exists (its first write creates it: a kill then leaves files to
    # maintenance's orphan removal)
    leased = spark.catalog.tableExists(dead)
    if leased:
        leases.take(dead)
    write_dead_letters(spark, namespace, stamped)
    if leased:
        leases.done(dead)
    log.warning("%d record(s) went to %s.%s", count, pipeline.namespace, DEAD_LETTERS)
    return count


def _with_raw(spark, pipeline: PipelineConfig, rows):
    """Dead-letter rows with their records' key, value and headers as Kafka holds them
    (read again: the rows kept only what could be parsed of them)."""
    coordinates = [tuple(r) for r in rows.select("topic", "partition", "offset").collect()]
    raw = raw_records(pipeline.kafka, coordinates)
    found = [(*at, key, value, [(k, v) for k, v in headers])
             for at, (key, value, headers) in raw.items()]  # fmt: skip
    frame = spark.createDataFrame(found, f"topic string, partition int, offset bigint, "
                                         f"{DEAD_LETTER_RAW}")  # fmt: skip
    return rows.join(frame, ["topic", "partition", "offset"], "left")


def _check_plan_start(
    qualified: str, committed: dict[TopicPartition, int], ranges: list[OffsetRange]
) -> bool:
    """True when an earlier attempt of this batch already committed it; raise when another
    run moved the table's offsets since the plan was made."""
    ends = {(r.topic, r.partition): r.end for r in ranges}
    starts = {(r.topic, r.partition): r.start for r in ranges}
    if all(committed.get(tp) == end for tp, end in ends.items()):
        return True
    moved = {tp: c for tp in starts if (c := committed.get(tp)) is not None and c != starts[tp]}
    if moved:
        expected = {tp: starts[tp] for tp in moved}
        raise CommitConflictError(
            f"{qualified}: committed offsets {moved} differ from the plan's start {expected}; "
            "another run loaded this table meanwhile. Nothing was written; plan again."
        )
    return False


def _load_table(
    batch: _Batch,
    table: TableConfig,
    ranges: list[OffsetRange],
    raw,
    schemas: dict[str, list[tuple[int, str]]],
) -> TableResult:
    spark, pipeline, plan = batch.spark, batch.pipeline, batch.plan
    qualified = pipeline.qualified_target(table)
    topic = pipeline.topic_for(table)
    records = sum(r.size for r in ranges)
    result = TableResult(table=qualified, topic=topic, status="skipped", records=records)
    result.seconds["read"] = round(batch.read_seconds, 3)
    clock = _Clock(result.seconds)
    state = table_state(spark, qualified)
    batch.compile_for(qualified, state.rows)
    committed = state.committed
    if plan.mode == PlanMode.REPLAY:
        # re-applied records never regress newer rows (LSN check in the MERGE), and the
        # committed offsets never move backwards
        ends = {(r.topic, r.partition): max(r.end, committed.get((r.topic, r.partition), 0))
                for r in ranges}  # fmt: skip
    elif _check_plan_start(qualified, committed, ranges):
        log.info("%s: batch %s was already committed", qualified, plan.batch_id)
        result.status = "already_committed"
        return result
    else:
        ends = {(r.topic, r.partition): r.end for r in ranges}
    known = table_columns(spark, qualified) if state.exists else {}
    ranged = batch.ranged.get(topic)
    if ranged is not None and known != ranged.known:
        raise CommitConflictError(
            f"{qualified}: another run changed the table's columns while this batch was "
            "resolved; nothing was written. Plan again."
        )
    found = schemas
    schemas, raw = _set_aside_misfits(batch, table, topic, schemas, known, raw, result)
    if not schemas.get("value") and not state.exists:
        log.info("%s: only tombstones for a table that does not exist yet; skipped", qualified)
        return result
    schema = topic_schema([s for _, s in schemas.get("key", [])],
                          [s for _, s in schemas.get("value", [])],
                          table.key, topic, table.exclude, known)  # fmt: skip
    clock.lap("state")
    # no record was set aside: `raw` holds all the topic's records
    resolved = _resolve_table(batch, topic, table, schema, schemas, schemas is found, raw,
                              result)  # fmt: skip
    clock.lap("resolve")
    new_offsets = {**committed, **ends}
    try:
        after_id = _write_table(batch, table, schema, state, known, new_offsets, resolved,
                                result)  # fmt: skip
    finally:
        resolved.rows.unpersist()
    clock.lap("write")
    result.status = "committed"
    result.truncated = resolved.truncate is not None
    result.snapshot_id = after_id
    for (t, p), o in sorted(new_offsets.items()):
        result.offsets.setdefault(t, {})[str(p)] = o
    log.info(
        "%s: committed %d records (%d upserts, %d deletes) in snapshot %s",
        qualified, records, result.upserts, result.deletes, after_id,
    )  # fmt: skip
    return result


@dataclass(frozen=True)
class _Resolved:
    """A table's resolved rows (persisted: the load unpersists them) and what the resolve
    found: the last truncate, the rows per deleted flag, the latest source time (epoch
    ms), and whether rows may hold TOAST placeholders."""

    rows: object
    truncate: Truncate | None
    counts: Mapping[bool, int]
    max_ms: int | None
    toast: bool


def _resolve_table(batch: _Batch, topic: str, table: TableConfig, schema: TopicSchema,
                   schemas: dict[str, list[tuple[int, str]]], whole: bool, raw,
                   result: TableResult) -> _Resolved:  # fmt: skip
    """The topic's changes resolved where they were read: range by range, in the driver,
    in Spark tasks grouped by key, or by the Spark SQL jobs."""
    key_schemas, value_schemas = dict(schemas.get("key", [])), dict(schemas.get("value", []))
    ranged = batch.ranged.get(topic)
    local = in_tasks = None
    if ranged is not None:
        got = ranged.accepted
        in_tasks = ranged.rows, got.counts, got.max_source_ms, got.toast
    elif whole and batch.rows is not None:  # read by the driver
        local = _resolve_in_driver(batch.rows, topic, schema, key_schemas, value_schemas)
    elif whole:
        in_tasks = _resolve_in_tasks(batch, raw, topic, table, schema, key_schemas,
                                     value_schemas, result.records)  # fmt: skip
    result.resolved_by = ("ranges" if ranged else "driver" if local else "tasks" if in_tasks
                          else "spark")  # fmt: skip
    if local is not None:
        rows = arrow_frame(batch.spark, local.rows, local.ddl)
        return _Resolved(rows, local.truncate, local.counts, local.max_source_ms, local.toast)
    if in_tasks is not None:
        truncate = ranged.accepted.truncate if ranged is not None else None
        rows, counts, max_ms, toast = in_tasks
        return _Resolved(rows, truncate, counts, max_ms, toast)
    changes = decode_changes(raw, schema, key_schemas, value_schemas)
    return _Resolved(*_check_and_resolve(batch, topic, schema, changes, result))


def _write_table(batch: _Batch, table: TableConfig, schema: TopicSchema, state: TableState,
                 known: dict[str, str], new_offsets: dict, resolved: _Resolved,
                 result: TableResult) -> int | None:  # fmt: skip
    """MERGE (or append) the resolved rows into the table, its new offsets in the same
    commit; the id of the snapshot that carries them."""
    spark, qualified = batch.spark, batch.pipeline.qualified_target(table)
    truncate, counts = resolved.truncate, resolved.counts
    result.upserts, result.deletes = counts.get(False, 0), counts.get(True, 0)
    with conflicts_reported(
        f"{qualified}: another run wrote to this table at the same time; this run's "
        "batch was not committed to it. Plan again."
    ):
        soft = table.delete_mode is DeleteMode.SOFT
        lake_columns = ensure_table(spark, qualified, schema, table.properties,
                                    table.partition_by, soft, existing=known)  # fmt: skip
        if state.exists:
            apply_table_settings(spark, qualified, state, table.properties,
                                 table.partition_by)  # fmt: skip
        batch.leases.take(qualified)  # before any data file of it or its ledger
        present = {c.name for c in schema.columns}
        dropped = [n for n in lake_columns if n not in present]
        props = _summary_properties(batch.plan.batch_id, new_offsets, result, resolved.max_ms)
        # the snapshot the offsets were read from: a commit by anyone else since then
        # makes the check below fail rather than pass for ours
        before_id = state.snapshot_id
        view = f"cdclake_changes_{table.target}"
        # hard deletes: a ledger of deleted keys keeps re-sent older changes out
        hard = bool(schema.key_names) and not soft
        rows = resolved.rows
        source = with_deleted_lsn(spark, qualified, rows, schema) if hard else rows
        source.createOrReplaceTempView(view)
        if hard and result.deletes:
            record_deleted_keys(spark, qualified, rows, schema)
        below = state.truncated_below
        if truncate is not None and truncate.lsn is not None:
            below = mark_truncated(spark, qualified, truncate.lsn, below)
        # a keyed table that holds no row takes only the MERGE's inserts: an append
        keyed = bool(schema.key_names)
        first_load = keyed and FIRST_LOAD_APPEND and state.empty and not dropped
        query = merge_sql = None
        if first_load:
            query = build_first_load_sql(view, schema, soft, deleted_lsn=hard,
                                         truncated_below=below)  # fmt: skip
        elif keyed:
            toast_columns = [c.name for c in toastable(schema)] if resolved.toast else []
            merge_sql = build_merge_sql(
                qualified, view, schema, toast_columns,
                truncate_lsn=truncate.lsn if truncate else None, truncate=truncate is not None,
                dropped_columns=dropped, soft_delete=soft, deleted_lsn=hard,
                truncated_below=below, key_values=_key_filter(state, schema, rows, truncate,
                                                              counts),
            )  # fmt: skip
        else:
            merge_sql = build_append_sql(qualified, view, schema, soft_delete=soft)
        result.written_by = "merge" if keyed and not first_load else "append"
        try:
            batch.leases.check(qualified)
            with commit_properties(spark, props):
                if query is not None:
                    append_to_empty(spark, qualified, query, before_id)
                else:
                    spark.sql(merge_sql)
        finally:
            spark.catalog.dropTempView(view)
        after_id = _check_commit(spark, qualified, before_id, props)
        batch.leases.done(qualified)
    return after_id


def _summary_properties(batch_id: str, offsets: dict, result: TableResult,
                        max_ms: int | None) -> dict[str, str]:  # fmt: skip
    """The snapshot summary a load's commit carries: its offsets, batch and figures."""
    props = {
        SUMMARY_OFFSETS: encode_offsets(offsets),
        SUMMARY_BATCH: batch_id,
        SUMMARY_RECORDS: str(result.records),
        SUMMARY_UPSERTS: str(result.upserts),
        SUMMARY_DELETES: str(result.deletes),
    }
    if max_ms is not None:
        props[SUMMARY_SOURCE_TS] = str(max_ms)
    return props


def _check_commit(spark, qualified: str, before_id: int | None,
                  props: Mapping[str, str]) -> int | None:  # fmt: skip
    """The snapshot that carries the batch's offsets: an empty commit carries them when
    nothing changed; another run's commit in between fails the check."""
    after_id, summary = current_snapshot(spark, qualified)
    if after_id == before_id:
        commit_empty(spark, qualified, props)  # nothing changed, offsets still move
        after_id, summary = current_snapshot(spark, qualified)
    if summary.get(SUMMARY_OFFSETS) != props[SUMMARY_OFFSETS]:
        raise CommitConflictError(
            f"{qualified}: snapshot {after_id} does not carry this batch's offsets"
        )
    return after_id


# A keyed table that holds no row is written by an append that checks no other commit
# added rows (`append_to_empty`), instead of a MERGE.
FIRST_LOAD_APPEND = True


# A MERGE into a table of at least this many rows, of at most KEY_FILTER_KEYS changes,
# names the values of its key columns in the join condition (`build_merge_sql`), when
# they are integers or text: 10,000 changes into a 10M-row table took 9.2 s without it.
# A smaller table is cheaper to join whole than the extra job that collects the keys.
# Text keys whose literals would pass KEY_FILTER_CHARS characters go without. A MERGE
# of more changes gives each integer key column the range of its values instead:
# 100,000 changes to the newest 5% of a 10M-row table took 2.4-3.1 s with it, 7.0-12.0 s
# without; spread over the whole table no slower (7.9-12.5 s against 8.5-16.8 s).
KEY_FILTER_ROWS = 1_000_000
KEY_FILTER_KEYS = 20_000
KEY_FILTER_CHARS = 1_000_000


def _key_filter(state: TableState, schema: TopicSchema, resolved, truncate, counts):
    """The values of each key column among the resolved rows, sorted, or the range of
    each integer key column's, when the MERGE is worth filtering by them (None: not)."""
    keys = schema.key
    changes = sum(counts.values())
    if truncate is not None or not keys or state.rows < KEY_FILTER_ROWS or changes <= 0:
        return None
    from pyspark.sql import functions as F

    if changes > KEY_FILTER_KEYS or any(k.type not in KEY_FILTER_TYPES for k in keys):
        integers = [k.name for k in keys if k.type in INTEGER_TYPES]
        if not integers:
            return None
        aggs = [f(F.col(f"`{n}`")) for n in integers for f in (F.min, F.max)]
        found = resolved.agg(*aggs).first()
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
    if sum(len(v) for vs in values.values() for v in vs if isinstance(v, str)) > KEY_FILTER_CHARS:
        return None
    try:
        key_filter_sql(schema, values)
    except ValueError:  # a text no SQL literal holds
        return None
    return values


class _Clock:
    """Seconds per stage into `seconds`: each `lap` takes the time since the last one."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds, self.last = seconds, time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(now - self.last, 3)
        self.last = now


def _set_aside_misfits(
    batch: _Batch,
    table: TableConfig,
    topic: str,
    schemas: dict[str, list[tuple[int, str]]],
    known: dict[str, str],
    raw,
    result: TableResult,
):
    """Records whose schema version does not fit the table's columns (an incompatible
    type change in the source, e.g. text -> integer): fail naming the first of them, or
    dead-letter them all and go on with the rest. Returns the schemas and records left."""
    from pyspark.sql import functions as F

    rejected = _misfits(table, topic, schemas, known)
    if not rejected:
        return schemas, raw
    reason = None
    for (side, sid), text in rejected.items():
        cond = F.col(f"{side}_schema_id") == F.lit(sid)
        reason = F.when(cond, F.lit(text)) if reason is None else reason.when(cond, F.lit(text))
    marked = raw.withColumn("_misfit", reason)
    misfits = marked.where(F.col("_misfit").isNotNull())
    if batch.pipeline.on_error is OnError.DEAD_LETTER:
        dead = misfits.select(
            "topic", "partition", "offset",
            F.col("key_payload").alias("key"), F.col("value_payload").alias("value"),
            F.col("_misfit").alias("error"),
        )  # fmt: skip
        result.dead_letters += batch.dead_letters(dead, dead.count())
        left = {
            side: [(sid, t) for sid, t in versions if (side, sid) not in rejected]
            for side, versions in schemas.items()
        }
        return left, marked.where(F.col("_misfit").isNull()).drop("_misfit")
    first = misfits.orderBy("partition", "offset").limit(1).collect()[0]
    target = batch.pipeline.qualified_target(table)
    if first._misfit == NOT_AN_ENVELOPE:
        raise DecodeError(
            f"{topic} partition {first.partition} offset {first.offset}: {first._misfit}. "
            f"Nothing of this batch was written to {target}. To go on, set on_error: "
            "dead_letter (these records are set aside), or remove the transform that "
            "changed the connector's records."
        )
    raise DecodeError(
        f"{topic} partition {first.partition} offset {first.offset}: {first._misfit}. "
        f"Nothing of this batch was written to {target}. To go "
        "on, set on_error: dead_letter (these records are set aside), or take the new type: "
        "drop the column from the lake table, load (records of the old type in the same "
        "batch are set aside or fail), and run an incremental snapshot of the table."
    )


# a value schema without Debezium's envelope (op, before/after): a record flattened by
# ExtractNewRecordState, or written to the topic by something else
NOT_AN_ENVELOPE = (
    "value is not a Debezium change event envelope (no op and before/after "
    "fields: a record flattened by a transform such as ExtractNewRecordState?)"
)


def _misfits(table: TableConfig, topic: str, schemas: dict[str, list[tuple[int, str]]],
             known: dict[str, str]) -> dict[tuple[str, int], str]:  # fmt: skip
    """(side, schema id) -> why that schema version does not fit the table's columns."""
    rejected: dict[tuple[str, int], str] = {}
    for sid, text in schemas.get("value", []):
        try:
            value_row_fields(parse_connect_schema(text), topic)
        except DecodeError:
            rejected[("value", sid)] = NOT_AN_ENVELOPE
    for side in ("key", "value") if not table.key else ("value",):
        versions = [
            (sid, value_row_fields(parse_connect_schema(text), topic) if side == "value"
             else parse_connect_schema(text).fields)
            for sid, text in schemas.get(side, []) if (side, sid) not in rejected
        ]  # fmt: skip
        exclude = table.exclude if side == "value" else ()
        types = column_types([f for _, f in versions], known, exclude)
        for sid, fields in versions:
            if (reason := misfit(fields, types, exclude)) is not None:
                rejected[(side, sid)] = reason
    return rejected


def _resolve_in_driver(rows, topic: str, schema: TopicSchema, key_schemas: dict,
                       value_schemas: dict) -> DriverResolved | None:  # fmt: skip
    """The topic's records resolved in the driver, or None when the Spark jobs must do it
    (a record that cannot be applied, a value the driver does not decode as Spark does)."""
    import pyarrow.compute as pc

    mine = rows.filter(pc.and_(pc.equal(rows["topic"], topic), pc.is_null(rows["error"])))
    try:
        return resolve_rows(mine, schema, key_schemas, value_schemas)
    except Unsupported as why:
        log.info("%s: resolved by Spark jobs: %s", topic, why)
        return None


def _resolve_in_tasks(batch: _Batch, raw, topic: str, table: TableConfig, schema: TopicSchema,
                      key_schemas: dict, value_schemas: dict, records: int):  # fmt: skip
    """(resolved rows, persisted; counts; latest source ms; TOAST flags) from Spark tasks
    running the driver's resolve over each key's records, or None when the Spark SQL jobs
    must do it. Every record of a key has the same Kafka key text, so a shuffle by that
    text puts all of a key's records of the batch in one task."""
    if not batch.placement.in_tasks:
        return None
    why = tasks_can_resolve(schema, key_schemas, table.key)
    if why is None and topic in batch.scan.truncates:
        why = "the topic may hold a truncate"
    if why is not None:
        log.info("%s: resolved by Spark jobs: %s", topic, why)
        return None
    toast = topic in batch.scan.toasts
    task = resolve_task(schema, key_schemas, value_schemas, toast)
    resolved = (
        raw.select(*RAW_COLUMNS)
        .repartition(max(1, -(-records // TASK_RECORDS)), "key_payload")
        .mapInArrow(task, task_ddl(schema, toast))
        .persist(cache_level(records))
    )
    try:
        counts, max_ms = _summary(_stats(resolved).collect())
    except Exception as exc:
        resolved.unpersist()
        if UNSUPPORTED_MARK not in str(exc):
            raise
        reason = str(exc).split(UNSUPPORTED_MARK, 1)[1].splitlines()[0]
        log.info("%s: resolved by Spark jobs: %s", topic, reason)
        return None
    return resolved, counts, max_ms, toast


def _summary(stats) -> tuple[dict[bool, int], int | None]:
    """Rows per deleted flag and the latest source timestamp (epoch ms) from `_stats`."""
    counts = {r[DELETED]: r["n"] for r in stats}
    max_ts = max((r["ts"] for r in stats if r["ts"] is not None), default=None)
    return counts, None if max_ts is None else int(max_ts.timestamp() * 1000)


def _check_and_resolve(batch: _Batch, topic: str, schema: TopicSchema, changes, result):
    """Check the decoded changes (fail, or dead-letter the bad ones), find the truncate,
    and resolve the latest change per key.

    Decoding (a JSON parse of every payload) is the costly part: the decoded rows, with
    the reason each one cannot be applied, are kept for the check and the resolve and
    dropped once the resolved rows are. The resolved rows are cached by the aggregation
    that counts them and finds the latest source timestamp. The check (first invalid
    record, how many, the last truncate) runs in that same job when the batch's raw scan
    says the topic has no truncate; else it is a job of its own before the resolve,
    which needs the truncate's position. Nothing is written before both are known.
    Returns the resolved rows (persisted; the caller unpersists them), the truncate, the
    count of rows per deleted flag and the latest source timestamp (epoch milliseconds).
    """
    from pyspark.sql import functions as F

    level = cache_level(result.records)
    dead_letter = batch.pipeline.on_error is OnError.DEAD_LETTER
    changes = changes.withColumn(REASON, invalid_reason(schema))
    if not dead_letter:  # the payload text is only kept for dead letters
        changes = changes.drop("key_payload", "value_payload")
    changes = changes.persist(level)
    resolved = None
    try:
        valid = changes.where(F.col(REASON).isNull()).drop(REASON)
        together = bool(schema.key_names) and topic not in batch.scan.truncates
        toast, check = True, None
        if together:
            truncate, toast = None, topic in batch.scan.toasts
            resolved = resolve_latest(valid, schema, None, toast=toast)
            resolved = resolved.persist(level)
            check, stats = _check_with_stats(changes, resolved, schema, placeholders=not toast)
            if check.truncate is not None or check.placeholders:
                # the raw scan missed a truncate or a placeholder: resolve again with them
                # (the check already found the truncate)
                log.warning("%s: a truncate or TOAST placeholder the raw scan did not see; "
                            "resolving again", topic)  # fmt: skip
                resolved.unpersist()
                together, toast = False, True
        if not together:
            if check is None:
                check = check_changes(changes, schema)
            if schema.key_names:
                truncate = check.truncate
                resolved = resolve_latest(valid, schema, truncate)
            else:  # no key: every change is appended, truncates included
                truncate, resolved = None, changelog(valid, schema)
            resolved = resolved.persist(level)
        if not dead_letter:
            check.raise_invalid(topic)
        elif check.invalid:
            dead = changes.where(F.col(REASON).isNotNull()).select(
                F.lit(topic).alias("topic"), "partition", "offset",
                F.col("key_payload").alias("key"), F.col("value_payload").alias("value"),
                F.col(REASON).alias("error"),
            )  # fmt: skip
            result.dead_letters += batch.dead_letters(dead, check.invalid)
        if not together:
            stats = _stats(resolved).collect()
    except BaseException:
        if resolved is not None:
            resolved.unpersist()
        raise
    finally:
        changes.unpersist()
    counts, max_ms = _summary(stats)
    return resolved, truncate, counts, max_ms, toast


def _stats(resolved):
    """Rows per deleted flag, and the latest source timestamp of each."""
    from pyspark.sql import functions as F

    return resolved.groupBy(DELETED).agg(F.count(F.lit(1)).alias("n"), F.max(SOURCE_TS).alias("ts"))


def _check_with_stats(changes, resolved, schema: TopicSchema, placeholders: bool = False):
    """The check of the changes and the stats of the resolved rows, in one Spark job:
    (ChangeCheck, stats rows)."""
    from pyspark.sql import functions as F

    stats = _stats(resolved).select(
        F.lit(False).alias("is_check"), DELETED, "n", "ts",
        F.lit(None).cast(CHECK_FIRST_TYPE).alias("first"),
        F.lit(None).cast(CHECK_TRUNCATE_TYPE).alias("truncate"),
        F.lit(None).cast("bigint").alias("placeholders"),
    )  # fmt: skip
    aggs = check_aggregates(changes, schema, placeholders=placeholders)
    check = changes.agg(*aggs).select(
        F.lit(True).alias("is_check"), F.lit(None).cast("boolean").alias(DELETED), "n",
        F.lit(None).cast("timestamp").alias("ts"), "first", "truncate",
        F.col("placeholders") if placeholders else F.lit(None).cast("bigint").alias("placeholders"),
    )  # fmt: skip
    rows = stats.unionByName(check).collect()
    found = next(r for r in rows if r["is_check"])
    return read_check(found), [r for r in rows if not r["is_check"]]
