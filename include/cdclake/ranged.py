"""A big batch read and resolved range by range: a Spark task per Kafka partition's range
reads it and folds its changes (`resolve.ranges`); the driver reads the ranges' heads for
the topics' schemas and checks that the ranges' results add up."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cdclake.config import PipelineConfig, TableConfig
from cdclake.debezium.formats import WireFormat
from cdclake.debezium.schema import OP
from cdclake.exceptions import CdclakeError
from cdclake.iceberg.tables import table_columns, table_state
from cdclake.kafka.reader import KAFKA, RawSource, range_plan
from cdclake.offsets import BatchPlan, OffsetRange
from cdclake.resolve.placement import Placement, Tuning
from cdclake.resolve.range_plan import AcceptedTopic, accept, head_schemas
from cdclake.resolve.ranges import KEYS_COLUMN, META_COLUMN, RangeSummary, TopicPlan, range_task
from cdclake.resolve.rules import LINEAGE_OPS
from cdclake.setaside import misfits
from cdclake.spark import cache_level

log = logging.getLogger(__name__)


@dataclass
class RangedTopic:
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
class FailedTopic:
    """A topic whose ranges' read or resolve failed (a task, the read of their head):
    its table's load fails with that error, the other tables load. Nothing reads it
    again another way: Spark retried the task already, and the next run tries again."""

    error: Exception

    def release(self) -> None:
        pass


def step_for(placement: Placement, records: int, tuning: Tuning,
             read: Callable | None) -> Placement:  # fmt: skip
    """The step of `placement`'s rule that reads `records` records from `read` (None:
    Kafka): `Placement.DRIVER`, `RANGES` or `TASKS` (`Placement.first_step`)."""
    source = KAFKA if read is None else read
    return placement.first_step(records, tuning.driver_read_records, read is None,
                                isinstance(source, RawSource))  # fmt: skip


def read_by_range(spark, pipeline: PipelineConfig, plan: BatchPlan, read: Callable | None,
                   placement: Placement, tuning: Tuning):  # fmt: skip
    """The topics read and resolved range by range, or whose ranges failed ({} when
    none is): the driver reads the head of each eligible topic's ranges for its schemas
    (all at once, while it looks the lake tables up), then for each topic (as many at a
    time as tables are loaded) one Spark job reads its ranges, a task each, and resolves
    them into typed rows, kept when they add up (`_ranged_topic`)."""
    if step_for(placement, plan.total, tuning, read) is not Placement.RANGES:
        return {}
    source = KAFKA if read is None else read
    topics = {r.topic for r in plan.ranges}
    tables = {pipeline.topic_for(t): t for t in pipeline.tables}
    eligible = [topic for topic in tables if topic in topics]
    if not eligible:
        return {}
    reader = source.open(pipeline.kafka)
    ranges_of = {topic: [r for r in plan.ranges if r.topic == topic] for topic in eligible}
    # the heads of the ranges are read while the lake tables are looked up (a cold
    # catalog's first lookups take a second or two)
    threading.Thread(target=start_python_workers, args=(spark,), daemon=True).start()
    with ThreadPoolExecutor(len(eligible)) as pool:
        heads = {topic: pool.submit(head_schemas, reader,
                                    [dataclasses.asdict(r) for r in ranges_of[topic]])
                 for topic in eligible}  # fmt: skip
        work = {}
        for topic in eligible:
            qualified = pipeline.qualified_target(tables[topic])
            state = table_state(spark, qualified)
            known = table_columns(spark, qualified) if state.exists else {}
            work[topic] = (tables[topic], known, state.truncate_applied)
    done: dict[str, RangedTopic | FailedTopic] = {}

    def resolve(topic: str) -> None:
        table, known, cut = work[topic]
        got = _resolve_topic(spark, pipeline, reader, table, known, cut, heads[topic],
                             ranges_of[topic], tuning)  # fmt: skip
        if got is not None:
            done[topic] = got

    try:  # every topic resolves; then the first error is raised
        with ThreadPoolExecutor(max(1, min(pipeline.parallel_tables, len(work)))) as pool:
            futures = [pool.submit(resolve, topic) for topic in work]
        for future in futures:
            future.result()
    except BaseException:
        for topic in done.values():
            topic.release()
        raise
    return done


def _resolve_topic(spark, pipeline: PipelineConfig, reader, table: TableConfig,
                   known: dict[str, str], cut: int | None, head, ranges: list[OffsetRange],
                   tuning: Tuning):  # fmt: skip
    """One topic's ranges read and resolved by a Spark job (`head`: the future of their
    head read): its rows when they add up, a FailedTopic when a read or a task failed,
    or None (the log says why) when the topic takes the general path."""
    from pyspark import StorageLevel

    topic = ranges[0].topic
    frame = None
    try:
        planned = _topic_plan(head, table, topic, known, pipeline.kafka.format, tuning, cut)
        if planned is None:
            return None
        topic_plan, ddl = planned
        # A keyed topic's rows in memory, spilled to disk when storage memory runs short.
        # A cached block is built whole before it can spill, which is why a big batch's
        # raw records are cached on disk only (`cache_level`); here a block is one range's
        # rows, at most `Tuning.range_keys` (~1 KB each from the connector), whatever the
        # batch's size. A 1M-event batch took 1.2 s less cold than with its rows on disk.
        level = (StorageLevel.MEMORY_AND_DISK if topic_plan.schema.key_names
                 # a changelog: a row per record, not per key
                 else cache_level(sum(r.size for r in ranges)))  # fmt: skip
        frame = (
            range_plan(spark, ranges)
            .mapInArrow(range_task(reader, {topic: topic_plan}), ddl)
            .persist(level)
        )
        got = _ranged_topic(frame, topic_plan)
    except Exception as exc:
        if frame is not None:
            frame.unpersist()
        if isinstance(exc, CdclakeError):  # the rows do not add up: nothing is written
            raise
        # a read, a task, a bug: its table fails with the error
        log.error("%s: its ranges failed: %s", topic, _brief(exc))
        return FailedTopic(exc)
    if got is None:
        frame.unpersist()
    return got


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

    import cdclake.resolve.ranges  # noqa: F401

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"pid": [os.getpid()]}, pa.schema([("pid", pa.int64())]))


def _topic_plan(head, table: TableConfig, topic: str, known: dict[str, str],
                fmt: WireFormat, tuning: Tuning,
                cut: int | None) -> tuple[TopicPlan, str] | None:  # fmt: skip
    """The plan of a topic's range tasks, with the schemas at the head of its ranges
    (`head`, the future of its `head_schemas`: a read that failed raises), and the schema
    of their rows; None (the log says why) when the topic must take the general path."""
    found = head.result()
    why = None
    if found is None:
        why = "no schema at the head of its ranges"
    else:
        schemas = {"key": [found[0]] if found[0] else [], "value": [found[1]] if found[1] else []}
        if misfits(table, topic, schemas, known, fmt):
            why = "a schema that does not fit the table's columns"
        else:
            topic_plan = TopicPlan(topic, found[0], found[1], tuple(table.exclude), known,
                                   tuple(table.key), fmt, tuning, cut)  # fmt: skip
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
    row = meta.isNull() & ~F.col(OP).isin(*LINEAGE_OPS).eqNullSafe(True)  # a table's row
    [found] = frame.agg(F.collect_list(F.when(meta.isNotNull(), ends)).alias("ends"),
                        F.count(F.when(row, 1)).alias("rows")).collect()  # fmt: skip
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
    return RangedTopic(got, rows, plan.known, frame)


def _brief(exc: BaseException, limit: int = 500) -> str:
    """An error's text for one log line: its last line that is not a stack frame (a
    Spark job's error ends with the task's own), cut to `limit` characters."""
    lines = [line.strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line and not line.startswith(("at ", "..."))]
    text = lines[-1] if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
