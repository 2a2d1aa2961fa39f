"""A big batch read and resolved range by range: a Spark task per Kafka partition's range
reads it and folds its changes (`resolve.ranges`); the driver reads the ranges' heads for
the topics' schemas and checks that the ranges' results add up."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from cdclake.config import PipelineConfig, TableConfig
from cdclake.debezium.formats import WireFormat
from cdclake.debezium.schema import OP
from cdclake.exceptions import CdclakeError
from cdclake.iceberg.tables import TableState, table_columns, table_state
from cdclake.kafka.reader import RangeReader, RawSource, range_plan
from cdclake.offsets import BatchPlan, OffsetRange
from cdclake.placement import Tuning
from cdclake.resolve.range_plan import (
    BAD_COLUMN,
    KEYS_COLUMN,
    META_COLUMN,
    AcceptedTopic,
    RangeSummary,
    Schema,
    TopicPlan,
    accept,
    head_schemas,
)
from cdclake.resolve.ranges import range_task
from cdclake.resolve.rules import LINEAGE_OPS
from cdclake.setaside import misfits
from cdclake.spark import cache_level, is_connect

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


@dataclass
class RangedTopic:
    """A topic of the batch read and resolved range by range: what its ranges added up
    to, its resolved rows (of `frame`, the range job's output, persisted), and the lake
    columns they were resolved for."""

    topic: str
    accepted: AcceptedTopic
    rows: DataFrame
    known: Mapping[str, str]
    frame: DataFrame

    def release(self) -> None:
        self.frame.unpersist()

    def set_aside(self) -> DataFrame:
        """The records its ranges set aside, as the dead letters take them (topic,
        partition, offset, key and value payload text, error)."""
        from pyspark.sql import functions as F

        bad = F.col(f"`{BAD_COLUMN}`")
        return self.frame.where(bad.isNotNull()).select(
            F.lit(self.topic).alias("topic"),
            bad["partition"].alias("partition"),
            bad["offset"].alias("offset"),
            bad["key"].alias("key"),
            bad["value"].alias("value"),
            bad["reason"].alias("error"),
        )


@dataclass(frozen=True)
class FailedTopic:
    """A topic whose ranges' read or resolve failed (a task, the read of their head):
    its table's load fails with that error, the other tables load. Nothing reads it
    again another way: Spark retried the task already, and the next run tries again."""

    error: Exception

    def release(self) -> None:
        pass


def read_by_range(
    spark: SparkSession,
    pipeline: PipelineConfig,
    plan: BatchPlan,
    source: RawSource,
    tuning: Tuning,
) -> dict[str, RangedTopic | FailedTopic]:
    """The batch's topics read and resolved range by range, or whose ranges failed: the
    driver reads the head of each topic's ranges for its schemas (all at once, while it
    looks the lake tables up), then for each topic (as many at a time as tables are
    loaded) Spark jobs read its ranges and resolve them into typed rows
    (`_resolve_topic`)."""
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
        heads = {
            topic: pool.submit(
                head_schemas, reader, [dataclasses.asdict(r) for r in ranges_of[topic]]
            )
            for topic in eligible
        }
        work = {}
        for topic in eligible:
            qualified = pipeline.qualified_target(tables[topic])
            state = table_state(spark, qualified)
            known = table_columns(spark, qualified) if state.exists else {}
            work[topic] = (tables[topic], known, state)
    done: dict[str, RangedTopic | FailedTopic] = {}

    def resolve(topic: str) -> None:
        table, known, state = work[topic]
        done[topic] = _resolve_topic(
            spark, pipeline, reader, table, known, state, heads[topic], ranges_of[topic], tuning
        )

    try:  # every topic resolves; then the first error is raised
        with ThreadPoolExecutor(max(1, min(pipeline.parallel_tables, len(work)))) as pool:
            futures = [pool.submit(resolve, topic) for topic in work]
        for future in futures:
            future.result()
    except BaseException:
        for got in done.values():
            got.release()
        raise
    return done


def _resolve_topic(
    spark: SparkSession,
    pipeline: PipelineConfig,
    reader: RangeReader,
    table: TableConfig,
    known: dict[str, str],
    state: TableState,
    head: Future[tuple[Schema | None, Schema | None] | None],
    ranges: list[OffsetRange],
    tuning: Tuning,
) -> RangedTopic | FailedTopic:
    """One topic's ranges read and resolved (`state`: its lake table's; `head`: the
    future of their head read): its rows, or a FailedTopic when a read, a task or a
    check failed. A Spark job folds each range in a task (`_range_frame`), or all of
    them in one task, in partition order, as the driver folds a small batch, when the
    table's key is a configured one. When
    ranges met schemas beyond their heads, the job runs again with them; when the
    ranges' results cannot be put together (a key in two of them, a truncate after
    changes of another partition), again in one task."""
    topic = ranges[0].topic
    fmt = pipeline.kafka.format
    frame: DataFrame | None = None
    try:
        plan = _topic_plan(head.result(), table, topic, known, fmt, tuning, state)
        # a configured key is not the Kafka key: its records spread over the partitions
        together = bool(table.key) and len({r.partition for r in ranges}) > 1
        for _ in range(ROUNDS):
            frame = _range_frame(spark, reader, plan, ranges, together, tuning)
            summaries, hashes, rows = _summaries(frame)
            if any(s.unplanned for s in summaries):
                plan = plan.with_met(
                    summaries, partial(misfits, table, topic, known=known, fmt=fmt)
                )
                log.info("%s: schemas beyond the head of its ranges; read again with them", topic)
            else:
                got = accept(summaries, plan, hashes)
                if not isinstance(got, str):
                    return _ranged_topic(frame, plan, got, rows)
                if together:
                    raise CdclakeError(f"{topic}: its ranges read in one task: {got}")
                log.info("%s: %s; its ranges are read again in one task", topic, got)
                together = True
            frame.unpersist()
            frame = None
        raise CdclakeError(f"{topic}: its ranges met new schemas in every read")
    except Exception as exc:
        if frame is not None:
            frame.unpersist()
        # a read, a task, a schema the lake cannot take, rows that do not add up: its
        # table fails with the error, and nothing of it is written
        log.error("%s: its ranges failed: %s", topic, _brief(exc))
        return FailedTopic(exc)


# reads of a topic's ranges at most: as planned, again with the schemas they met beyond
# their heads, again in one task
ROUNDS = 3


def _range_frame(
    spark: SparkSession,
    reader: RangeReader,
    plan: TopicPlan,
    ranges: list[OffsetRange],
    together: bool,
    tuning: Tuning,
) -> DataFrame:
    """The Spark job that reads and folds the topic's ranges, a task each (`together`:
    one task for all), persisted: the resolved rows, then a summary row per task."""
    from pyspark import StorageLevel

    # A keyed topic's rows in memory, spilled to disk when storage memory runs short.
    # A cached block is built whole before it can spill, which is why a big batch's
    # rows are cached on disk only (`cache_level`); here a block is one task's rows, at
    # most its records, which stay under twice `Tuning.range_keys` (~1 KB each from the
    # connector). A 1M-event batch took 1.2 s less cold than with its rows on disk.
    most = max(r.size for r in ranges) * (len(ranges) if together else 1)
    keyed = plan.planned and bool(plan.schema.key_names)
    level = (
        StorageLevel.MEMORY_AND_DISK
        if keyed and most <= 2 * tuning.range_keys
        else cache_level(sum(r.size for r in ranges))
    )
    job = range_plan(spark, ranges)
    if together:
        job = job.coalesce(1)
    task = range_task(reader, {plan.topic: plan}, together)
    return job.mapInArrow(task, plan.ddl).persist(level)


WORKERS_JOB_GROUP = "cdclake-python-workers"


def start_python_workers(spark: SparkSession) -> list[int]:
    """Start the Python workers of the executors' cores and import the range tasks'
    modules in them, while the driver looks the lake tables up and reads the heads (a
    job of one task per core; Spark keeps the workers for the tasks after it). A cold
    worker's start and imports otherwise fall on the first range tasks. The job is a
    `mapInArrow` as the range tasks are: Spark keeps a pool of workers per environment,
    and an RDD job's workers get another environment than a DataFrame's Arrow tasks.
    Returns the workers' process ids. Best effort: a failure is logged and the range
    tasks start their workers themselves. A Spark Connect server's workers outlive its
    batches: none are started there."""
    if is_connect(spark):
        return []
    sc = spark.sparkContext
    names = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
    try:
        cores = max(1, sc.defaultParallelism)
        kept = {name: sc.getLocalProperty(name) for name in names}
        sc.setJobGroup(WORKERS_JOB_GROUP, "start the Python workers for the range tasks")
        try:
            started = (
                spark.range(0, cores, 1, cores)
                .mapInArrow(_import_range_modules, "pid long")
                .collect()
            )
        finally:  # this thread's later jobs are not of the group
            for name, value in kept.items():
                # None unsets it (Spark's own API), which PySpark's annotation leaves out
                sc.setLocalProperty(name, value)  # type: ignore[arg-type]
        return sorted({row.pid for row in started})
    except Exception as exc:
        log.info("the Python workers were not started ahead of the range tasks: %s", _brief(exc))
        return []


def _import_range_modules(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import os

    import numpy  # noqa: F401
    import pyarrow as pa
    import pyarrow.compute  # noqa: F401

    import cdclake.resolve.ranges  # noqa: F401

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"pid": [os.getpid()]}, pa.schema([("pid", pa.int64())]))


def _topic_plan(
    found: tuple[Schema | None, Schema | None] | None,
    table: TableConfig,
    topic: str,
    known: dict[str, str],
    fmt: WireFormat,
    tuning: Tuning,
    state: TableState,
) -> TopicPlan:
    """The plan of a topic's range tasks, with the schemas at the head of its ranges
    (`found`: `head_schemas`'), those that do not fit the table's columns set aside."""
    key, value = found if found is not None else (None, None)
    plan = TopicPlan(
        topic,
        (key,) if key else (),
        (value,) if value else (),
        tuple(table.exclude),
        known,
        tuple(table.key),
        fmt,
        tuning,
        state.truncate_applied,
        lake_key=state.key_names,
    )
    return plan.with_met([], partial(misfits, table, topic, known=known, fmt=fmt))


def _summaries(frame: DataFrame) -> tuple[list[RangeSummary], list[np.ndarray], int]:
    """A range job's summaries, each task's key hashes, and the count of its rows (one
    job over the cached frame)."""
    import numpy as np
    from pyspark.sql import functions as F

    meta = F.col(f"`{META_COLUMN}`")
    ends = F.struct(meta.alias("summary"), F.col(f"`{KEYS_COLUMN}`").alias("hashes"))
    row = meta.isNull() & F.col(f"`{BAD_COLUMN}`").isNull()
    if OP in frame.columns:  # a table's row, not a key change's (`LINEAGE_OPS`)
        row = row & ~F.col(OP).isin(*LINEAGE_OPS).eqNullSafe(True)
    [found] = frame.agg(
        F.collect_list(F.when(meta.isNotNull(), ends)).alias("ends"),
        F.count(F.when(row, 1)).alias("rows"),
    ).collect()
    summaries = [RangeSummary.from_json(r.summary) for r in found.ends]
    hashes = [np.frombuffer(r.hashes or b"", dtype=np.uint64) for r in found.ends]
    return summaries, hashes, found.rows


def _ranged_topic(frame: DataFrame, plan: TopicPlan, got: AcceptedTopic, total: int) -> RangedTopic:
    """A topic's range results (`frame`, persisted; `total` rows) -> its rows, once
    they add up to what its ranges resolved."""
    from pyspark.sql import functions as F

    meta, bad = F.col(f"`{META_COLUMN}`"), F.col(f"`{BAD_COLUMN}`")
    rows = frame.where(meta.isNull() & bad.isNull()).select(
        *(F.col(f"`{n}`") for n, _ in got.columns)
    )
    resolved = sum(got.counts.values())
    if total != resolved:
        raise CdclakeError(
            f"{plan.topic}: the ranges resolved {resolved} rows but returned "
            f"{total}; nothing was written"
        )
    return RangedTopic(plan.topic, got, rows, plan.known, frame)


def _brief(exc: BaseException, limit: int = 500) -> str:
    """An error's text for one log line: its last line that is not a stack frame (a
    Spark job's error ends with the task's own), cut to `limit` characters."""
    lines = [line.strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line and not line.startswith(("at ", "..."))]
    text = lines[-1] if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
