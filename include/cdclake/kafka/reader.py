"""Extract: read exact Kafka offset ranges, inside the Spark executors or in the driver.

No spark-sql-kafka jar is available, so every offset range becomes one Spark task that
reads it with confluent-kafka and yields Arrow batches (`mapInArrow`). A small batch is
read by the driver itself (`read_local`), and its rows handed to Spark as a local
relation (`arrow_frame`): no job and no Python worker before the tables' own work. The
reader also splits each JSON-with-schema record into its schema and payload text: the
schema is sent once per task and then referred to by id, so the JVM parses payloads with
a known type.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, cast

from cdclake.config import KafkaConfig
from cdclake.offsets import OffsetRange
from cdclake.raw_rows import (
    RAW_FIELD_NAMES,
    RAW_SCHEMA,
    RawRows,
    RawRowsWriter,
    kept_headers,
    raw_arrow_schema,
)
from cdclake.spark import is_connect

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import Message
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType
SLICE_RECORDS = 50_000  # records per read of the driver's (`read_local`)
# The raw rows of a batch the driver reads (`read_local`; `Tuning.driver_read_records`)
# are held in its memory up to this many bytes: records bigger than that in all (wide
# TOASTed values) are read range by range after all.
DRIVER_READ_BYTES = 256 * 1024 * 1024


def slice_ranges(ranges: Sequence[OffsetRange], size: int = SLICE_RECORDS) -> list[OffsetRange]:
    """Cut ranges into tasks of at most `size` records, so partitions read in parallel."""
    return [
        OffsetRange(r.topic, r.partition, start, min(start + size, r.end))
        for r in ranges
        for start in range(r.start, r.end, size)
    ]


# A function a Spark task calls with one offset range ({"topic", "partition", "start",
# "end"}) to get its raw rows, in Arrow batches (picklable: it is sent to the tasks)
RangeReader = Callable[[dict[str, Any]], Iterator["pa.RecordBatch"]]


@dataclass(frozen=True)
class RawSource:
    """Where a batch's raw records come from: `open` gives, for the pipeline's Kafka
    settings, the `RangeReader` the driver (`read_local`) or the range tasks call. Kafka
    is the source of every pipeline; benchmarks read recorded or generated records, and
    a dead-letter replay their raw bytes, through the same code."""

    open: Callable[[KafkaConfig], RangeReader]


def range_plan(spark: SparkSession, ranges: Sequence[OffsetRange]) -> DataFrame:
    """One row per range (topic, partition, start, end), each in a Spark partition.

    Built in the JVM (an inline table of the ranges joined by their index to
    `spark.range`'s ids, one id a partition), not from Python data: converting that
    starts Python workers of their own, since an RDD job's workers are not those of the
    DataFrame's Arrow tasks that read the ranges."""
    from pyspark.sql import functions as F

    rows = (
        ", ".join(
            f"({i}L, {_sql_text(r.topic)}, {r.partition}, {r.start}L, {r.end}L)"
            for i, r in enumerate(ranges)
        )
        or "(0L, '', 0, 0L, 0L)"
    )
    plan = spark.sql(f"SELECT * FROM VALUES {rows} AS ranges(id, topic, partition, start, end)")
    if not ranges:
        return plan.drop("id").where(F.lit(False))
    n = len(ranges)
    return spark.range(0, n, 1, n).join(F.broadcast(plan), "id").drop("id")


def _sql_text(text: str) -> str:
    """`text` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class _SliceReader(Protocol):
    """A `RangeReader` of Kafka's, which also takes a batch's byte budget."""

    def __call__(
        self, row: dict[str, Any], batch_bytes: int | None = None
    ) -> Iterator[pa.RecordBatch]: ...


def _kafka_reader(kafka: KafkaConfig, timeout_s: float | None = None) -> _SliceReader:
    """The reader of slices from Kafka; a slice waits `timeout_s` for its next records, by
    default `timeouts.request_s`, a minute at least."""
    if timeout_s is None:
        timeout_s = max(60.0, kafka.timeouts.request_s)
    # the pipeline's format splits the records (`WireFormat.raw_rows`)
    split = partial(kafka.format.raw_rows, registry=kafka.schema_registry)
    return partial(_read_slice, kafka.client_config(), timeout_s=timeout_s, split=split)


KAFKA = RawSource(_kafka_reader)


def read_local(
    kafka: KafkaConfig,
    ranges: Sequence[OffsetRange],
    timeout_s: float | None = None,
    max_bytes: int = DRIVER_READ_BYTES,
    source: RawSource | None = None,
) -> pa.Table | None:
    """Read the ranges in this process, slice after slice, from Kafka (or `source`): the
    raw rows the Spark tasks of `KAFKA` would yield, as one Arrow table. None as
    soon as the rows hold more than `max_bytes` (what was read is dropped; the caller
    reads range by range)."""
    import pyarrow as pa

    from_kafka = source is None or source is KAFKA
    reader = _kafka_reader(kafka, timeout_s) if from_kafka or source is None else source.open(kafka)
    batches: list[pa.RecordBatch] = []
    held = 0
    for r in slice_ranges(ranges):
        # from Kafka, a batch comes as soon as its records pass what is left of the budget
        read = (
            cast(_SliceReader, reader)(asdict(r), batch_bytes=max_bytes - held)
            if from_kafka
            else reader(asdict(r))
        )
        for batch in read:
            held += batch.nbytes
            if held > max_bytes:
                return None
            batches.append(batch)
    return pa.Table.from_batches(batches, schema=raw_arrow_schema())


def arrow_frame(spark: SparkSession, rows: pa.Table, ddl: str | None = None) -> DataFrame:
    """Rows the driver holds as a DataFrame: a local relation, built in the JVM from
    Arrow (no Python worker). The schema is `ddl`, or `RAW_SCHEMA` for the reader's raw
    rows; the Arrow columns must be of the types Spark reads as it.

    PySpark 3.5 has no public way from an Arrow table to a DataFrame (Spark 4's
    `createDataFrame` takes one); this is what its own `createDataFrame` of a pandas
    frame does once the frame is in Arrow."""
    from pyspark.sql import DataFrame
    from pyspark.sql.pandas.serializers import ArrowStreamSerializer
    from pyspark.sql.types import _parse_datatype_string

    if is_connect(spark):
        return _connect_frame(spark, rows if ddl else rows.select(RAW_FIELD_NAMES), ddl)
    schema = cast("StructType", _parse_datatype_string(ddl or RAW_SCHEMA))  # a DDL's: a struct
    jvm: Any = spark._jvm
    batches = (rows if ddl else rows.select(RAW_FIELD_NAMES)).to_batches()
    if not batches:
        return spark.createDataFrame([], schema)
    stream = spark.sparkContext._serialize_to_jvm(
        batches,
        ArrowStreamSerializer(),
        lambda path: jvm.PythonSQLUtils.readArrowStreamFromFile(path),
        lambda: jvm.ArrowIteratorServer(),  # when I/O encryption is on
    )
    return DataFrame(
        jvm.PythonSQLUtils.toDataFrame(stream, schema.json(), spark._jsparkSession), spark
    )


def _connect_frame(spark: Any, rows: pa.Table, ddl: str | None) -> DataFrame:
    """`arrow_frame` on Spark Connect: the rows sent as a local relation, and one of more
    than the session's `localRelationCacheThreshold` bytes as an artifact first (what
    its `createDataFrame` does once the data is in Arrow)."""
    from pyspark.sql.connect.dataframe import DataFrame as ConnectFrame
    from pyspark.sql.connect.plan import CachedLocalRelation, LocalRelation

    plan: Any = LocalRelation(rows, schema=ddl or RAW_SCHEMA)  # the server parses the DDL
    limit = spark.conf.get("spark.sql.session.localRelationCacheThreshold", None)
    if limit is not None and int(limit) <= rows.nbytes:
        plan = CachedLocalRelation(spark._cache_local_relation(plan))
    return cast("DataFrame", ConnectFrame.withPlan(plan, spark))


def _read_slice(
    client_config: dict[str, Any],
    row: dict[str, Any],
    timeout_s: float,
    batch_bytes: int | None = None,
    split: Callable[[str, int], RawRowsWriter] = RawRows,
) -> Iterator[pa.RecordBatch]:
    """The raw rows of one slice, its records split by `split` (a format's splitter of
    one partition's records; JSON with schemas by default), in Arrow batches of up to
    10,000 records (or fewer once their records hold `batch_bytes`)."""
    import time
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    topic, partition, start, end = row["topic"], row["partition"], row["start"], row["end"]
    consumer = Consumer(
        {
            **client_config,
            "group.id": f"cdclake-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "fetch.max.bytes": 52428800,
            "queued.max.messages.kbytes": 262144,
        }
    )
    rows = split(topic, partition)
    gaps: list[bool] = []  # each record's `follows_gap`, of the records in `rows`
    held = 0  # record bytes in `rows`
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        next_offset = start
        last = None  # the key of the last record read
        idle_since = time.monotonic()
        while next_offset < end:
            # consume() waits out its timeout while it holds fewer messages than asked
            # for: never ask for more than the slice still needs
            msgs = consumer.consume(num_messages=min(2000, end - next_offset), timeout=1.0)
            if not msgs:
                if time.monotonic() - idle_since > timeout_s:
                    raise RuntimeError(
                        f"no records from Kafka at {client_config['bootstrap.servers']}: {topic}"
                        f"[{partition}]@{next_offset} (to {end - 1}) within {timeout_s:.0f}s"
                    )
                continue
            idle_since = time.monotonic()
            got, next_offset, last = _records(msgs, next_offset, end, last)
            if not got:
                continue
            offsets, stamps, keys, values, heads, after_gaps = zip(*got, strict=True)
            held += sum(map(len, filter(None, keys))) + sum(map(len, filter(None, values)))
            rows.add_many(
                offsets, stamps, keys, values, heads if any(h is not None for h in heads) else None
            )
            gaps.extend(after_gaps)
            if len(rows) >= 10_000 or (batch_bytes is not None and held > batch_bytes):
                yield _with_gaps(rows.batch(), gaps)
                gaps, held = [], 0
    finally:
        consumer.close()
    if len(rows):
        yield _with_gaps(rows.batch(), gaps)


def _with_gaps(batch: pa.RecordBatch, gaps: list[bool]) -> pa.RecordBatch:
    """The batch (a row per record read, in order) with each record's `follows_gap`."""
    import pyarrow as pa

    flags = pa.array(gaps, pa.bool_())
    return batch.set_column(batch.schema.get_field_index("follows_gap"), "follows_gap", flags)


def _records(
    msgs: list[Message], next_offset: int, end: int, last: bytes | None
) -> tuple[list[tuple[int, int, bytes | None, bytes | None, str | None, bool]], int, bytes | None]:
    """The records of `msgs` below `end` as (offset, timestamp, key, value,
    `kept_headers`, whether it follows a gap), and the next offset and last key read. A
    record follows a gap when the offsets before it were not read (a compacted topic's
    log cleaner removed them, or a transaction marker stands there) and the last record
    read is of another key."""
    from confluent_kafka import KafkaException

    records: list[tuple[int, int, bytes | None, bytes | None, str | None, bool]] = []
    for msg in msgs:
        err = msg.error()
        if err is not None:
            if err.code() == -191:  # _PARTITION_EOF: offsets may have gaps
                at = msg.offset()
                if at is not None and at >= end:
                    next_offset = end
                continue
            raise KafkaException(err)
        offset = cast(int, msg.offset())  # a record's, not an event's: set
        if offset >= end:
            next_offset = end
            break
        key, value, stamp = msg.key(), msg.value(), msg.timestamp()[1]
        gap = key is not None and offset > next_offset and key != last
        next_offset, last = offset + 1, key
        headers = cast(
            "list[tuple[str, bytes | None]]", msg.headers()
        )  # a consumed record's: pairs
        records.append((offset, stamp, key, value, kept_headers(headers) if headers else None, gap))
    return records, next_offset, last
