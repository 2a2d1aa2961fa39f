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

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from cdclake.config import KafkaConfig
from cdclake.offsets import OffsetRange

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

# The raw record rows the reader yields: (name, Spark type, Arrow type name), one list.
_FIELDS = [
    ("topic", "string", "string"),
    ("partition", "int", "int32"),
    ("offset", "long", "int64"),
    ("timestamp", "long", "int64"),
    ("key_schema_id", "long", "int64"),
    ("key_schema", "string", "string"),
    ("key_payload", "string", "string"),
    ("value_schema_id", "long", "int64"),
    ("value_schema", "string", "string"),
    ("value_payload", "string", "string"),
    ("is_tombstone", "boolean", "bool_"),
    ("error", "string", "string"),
    # the `__debezium.oldkey` header's text: the key a primary-key change's create had
    ("old_key", "string", "string"),
]
OLD_KEY_HEADER = "__debezium.oldkey"
RAW_SCHEMA = ", ".join(f"{name} {spark_type}" for name, spark_type, _ in _FIELDS)
_COLUMNS = [name for name, _, _ in _FIELDS]
_HEAD = b'{"schema":'
_SEP = b',"payload":'

SLICE_RECORDS = 50_000  # records per Spark task: one cached block each, kept small
# A batch of at most this many records is read by the driver (`read_local`). Spark tasks
# reading it cost a job and a Python worker's start before any table's work: for 100
# records over 10 topics, 6.5 s against 1.9 s read by the driver. Its rows (~4 KB each
# for the connector's JSON with schemas) are held in the driver's memory, up to
# DRIVER_READ_BYTES of them: records bigger than that in all (wide TOASTed values) are
# left to Spark tasks after all.
DRIVER_READ_RECORDS = 10_000
DRIVER_READ_BYTES = 256 * 1024 * 1024


def split_envelope(data: bytes) -> tuple[bytes, bytes]:
    """Split `{"schema":S,"payload":P}` into (S, P) without parsing P.

    The payload key is the envelope's last field and the schema part only has the fixed
    keys of a Kafka Connect schema, so the first `,"payload":` is the boundary.
    """
    if not data.startswith(_HEAD) or not data.endswith(b"}"):
        raise ValueError('not a JSON-with-schema envelope ({"schema":...,"payload":...})')
    cut = data.find(_SEP)
    if cut < 0:
        raise ValueError("JSON envelope has no payload field")
    return data[len(_HEAD) : cut], data[cut + len(_SEP) : -1]


def schema_id(schema: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(schema, digest_size=8).digest(), "big", signed=True)


class SchemaIds:
    """The schemas one reader task has met: each one's id, and which were sent already.

    Consecutive records nearly always share their schema, so a schema equal to the last
    one of its side (a memcmp) takes that one's id without hashing its ~3 KB again."""

    def __init__(self) -> None:
        self.sent: set[int] = set()
        self._last: dict[str, tuple[bytes, int]] = {}

    def last(self, side: str) -> tuple[bytes, int] | None:
        """The last schema of `side` and its id (sent already), if any."""
        return self._last.get(side)

    def id_of(self, side: str, schema: bytes) -> tuple[int, bool]:
        """The schema's id, and whether this is the first record of the task with it."""
        last = self._last.get(side)
        if last is not None and last[0] == schema:
            return last[1], False
        sid = schema_id(schema)
        self._last[side] = (schema, sid)
        first = sid not in self.sent
        self.sent.add(sid)
        return sid, first


def slice_ranges(ranges: Sequence[OffsetRange], size: int = SLICE_RECORDS) -> list[OffsetRange]:
    """Cut ranges into tasks of at most `size` records, so partitions read in parallel."""
    out = []
    for r in ranges:
        for start in range(r.start, r.end, size):
            out.append(OffsetRange(r.topic, r.partition, start, min(start + size, r.end)))
    return out


# A function a Spark task calls with one offset range ({"topic", "partition", "start",
# "end"}) to get its raw rows, in Arrow batches (picklable: it is sent to the tasks)
RangeReader = Callable[[dict], Iterator["pa.RecordBatch"]]


@dataclass(frozen=True)
class RawSource:
    """Where a batch's raw records come from when Spark tasks read them: `open` gives,
    for the pipeline's Kafka settings, the `RangeReader` the tasks call. Called like
    `read_ranges`, it makes the raw records DataFrame of the ranges, cut into tasks of at
    most `SLICE_RECORDS` records. Kafka is the source of every pipeline; benchmarks read
    recorded or generated records through the same code."""

    open: Callable[[KafkaConfig], RangeReader]

    def __call__(self, spark: SparkSession, kafka: KafkaConfig,
                 ranges: Sequence[OffsetRange]) -> DataFrame:  # fmt: skip
        reader = self.open(kafka)

        def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                for row in batch.to_pylist():
                    yield from reader(row)

        return range_plan(spark, slice_ranges(ranges)).mapInArrow(read, RAW_SCHEMA)


def range_plan(spark: SparkSession, ranges: Sequence[OffsetRange]) -> DataFrame:
    """One row per range (topic, partition, start, end), each in a Spark partition.

    Built in the JVM (an inline table of the ranges joined by their index to
    `spark.range`'s ids, one id a partition), not from Python data: converting that
    starts Python workers of their own, since an RDD job's workers are not those of the
    DataFrame's Arrow tasks that read the ranges."""
    from pyspark.sql import functions as F

    rows = ", ".join(f"({i}L, {_sql_text(r.topic)}, {r.partition}, {r.start}L, {r.end}L)"
                     for i, r in enumerate(ranges)) or "(0L, '', 0, 0L, 0L)"  # fmt: skip
    plan = spark.sql(f"SELECT * FROM VALUES {rows} AS ranges(id, topic, partition, start, end)")
    if not ranges:
        return plan.drop("id").where(F.lit(False))
    n = len(ranges)
    return spark.range(0, n, 1, n).join(F.broadcast(plan), "id").drop("id")


def _sql_text(text: str) -> str:
    """`text` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def idle_timeout(kafka: KafkaConfig, timeout_s: float | None = None) -> float:
    """A slice's wait for its next records: `timeouts.request_s`, a minute at least."""
    return timeout_s if timeout_s is not None else max(60.0, kafka.timeouts.request_s)


def _kafka_reader(kafka: KafkaConfig, timeout_s: float | None = None) -> RangeReader:
    return partial(_read_slice, kafka.client_config(), timeout_s=idle_timeout(kafka, timeout_s))


KAFKA = RawSource(_kafka_reader)


def read_ranges(
    spark: SparkSession, kafka: KafkaConfig, ranges: Sequence[OffsetRange],
    timeout_s: float | None = None,
) -> DataFrame:  # fmt: skip
    return RawSource(partial(_kafka_reader, timeout_s=timeout_s))(spark, kafka, ranges)


def read_local(
    kafka: KafkaConfig, ranges: Sequence[OffsetRange], timeout_s: float | None = None,
    max_bytes: int = DRIVER_READ_BYTES,
) -> pa.Table | None:  # fmt: skip
    """Read the ranges in this process, slice after slice: the raw rows the Spark tasks
    of `read_ranges` would yield, as one Arrow table. None as soon as the rows hold more
    than `max_bytes` (what was read is dropped; the caller reads with Spark tasks)."""
    import pyarrow as pa

    client_config, timeout_s = kafka.client_config(), idle_timeout(kafka, timeout_s)
    batches, held = [], 0
    for r in slice_ranges(ranges):
        row = {"topic": r.topic, "partition": r.partition, "start": r.start, "end": r.end}
        for batch in _read_slice(client_config, row, timeout_s, max_bytes - held):
            held += batch.nbytes
            if held > max_bytes:
                return None
            batches.append(batch)
    return pa.Table.from_batches(batches, schema=_arrow_schema())


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

    schema = _parse_datatype_string(ddl or RAW_SCHEMA)
    jvm = spark._jvm
    batches = (rows if ddl else rows.select(_COLUMNS)).to_batches()
    if not batches:
        return spark.createDataFrame([], schema)
    stream = spark.sparkContext._serialize_to_jvm(
        batches, ArrowStreamSerializer(),
        lambda path: jvm.PythonSQLUtils.readArrowStreamFromFile(path),
        lambda: jvm.ArrowIteratorServer(),  # when I/O encryption is on
    )  # fmt: skip
    return DataFrame(jvm.PythonSQLUtils.toDataFrame(stream, schema.json(), spark._jsparkSession),
                     spark)  # fmt: skip


def _read_slice(
    client_config: dict, row: dict, timeout_s: float, batch_bytes: int | None = None
) -> Iterator[pa.RecordBatch]:
    """The raw rows of one slice, in Arrow batches of up to 10,000 records (or fewer once
    their records hold `batch_bytes`)."""
    import time
    import uuid

    from confluent_kafka import Consumer, KafkaException, TopicPartition

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
    rows = RawRows(topic, partition)
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
            offsets: list[int] = []
            stamps: list[int] = []
            keys: list[bytes | None] = []
            values: list[bytes | None] = []
            old_keys: list[bytes | None] = []
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == -191:  # _PARTITION_EOF: offsets may have gaps
                        if msg.offset() is not None and msg.offset() >= end:
                            next_offset = end
                        continue
                    raise KafkaException(err)
                offset = msg.offset()
                if offset >= end:
                    next_offset = end
                    break
                key, value = msg.key(), msg.value()
                if value is None and key is not None and offset > next_offset and key != last:
                    # a tombstone right after a gap, not after a record of its key (a
                    # transaction marker between the two): the log cleaner of a compacted
                    # topic removed its delete (Debezium writes the two one after the
                    # other). A tombstone at the delete's offset stands in for it, so that
                    # this one deletes the row rather than following a delete of an
                    # earlier batch.
                    offsets.append(offset - 1)
                    stamps.append(msg.timestamp()[1])
                    keys.append(key)
                    values.append(None)
                    old_keys.append(None)
                next_offset, last = offset + 1, key
                offsets.append(offset)
                stamps.append(msg.timestamp()[1])
                keys.append(key)
                values.append(value)
                headers = msg.headers()
                old_keys.append(_old_key(headers) if headers else None)
                held += len(key or b"") + len(value or b"")
            rows.add_many(
                offsets,
                stamps,
                keys,
                values,
                old_keys if any(k is not None for k in old_keys) else None,
            )
            if len(rows) >= 10_000 or (batch_bytes is not None and held > batch_bytes):
                yield rows.batch()
                held = 0
    finally:
        consumer.close()
    if len(rows):
        yield rows.batch()


def _old_key(headers: list) -> bytes | None:
    """The value of a record's `__debezium.oldkey` header (None without one)."""
    for name, value in headers:
        if name == OLD_KEY_HEADER:
            return value
    return None


def _arrow_schema():
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, arrow)()) for name, _, arrow in _FIELDS])


def record_row(
    seen: SchemaIds, topic: str, partition: int, offset: int, timestamp: int,
    key: bytes | None, value: bytes | None, old_key: bytes | None = None,
) -> dict[str, object]:  # fmt: skip
    """One raw row: the record split into schema id, schema text (first time only) and
    payload per side; an envelope that cannot be split is kept with its error."""
    row: dict[str, object] = {
        "topic": topic, "partition": partition, "offset": offset, "timestamp": timestamp,
        "is_tombstone": value is None, "error": None,
        "old_key": None if old_key is None else old_key.decode("utf-8", "replace"),
    }  # fmt: skip
    for side, data in (("key", key), ("value", value)):
        row[f"{side}_schema_id"] = row[f"{side}_schema"] = row[f"{side}_payload"] = None
        if data is None:
            continue
        try:
            schema, payload = split_envelope(data)
            row[f"{side}_payload"] = payload.decode("utf-8")
            sid, first = seen.id_of(side, schema)
            row[f"{side}_schema_id"] = sid
            if first:
                row[f"{side}_schema"] = schema.decode("utf-8")
        except (ValueError, UnicodeDecodeError) as exc:
            row["error"] = f"{side}: {exc}"
    return row


class RawRows:
    """The raw rows of one reader task, gathered into Arrow batches.

    A record whose key and value each have the schema of the last record that had one
    (nearly every record) is split by comparing the start of its bytes with that
    envelope's `{"schema":S,"payload":`, without building a row; others go through
    `record_row`. `add_many` splits whole runs of such records with Arrow compute
    functions. All give the same rows (unit tests check them side by side)."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self.seen = SchemaIds()
        # per side: the envelope head of its last schema, and that schema's id
        self._head: dict[str, tuple[bytes, int] | None] = {"key": None, "value": None}
        self._cols: dict[str, list] = {name: [] for name in _COLUMNS}
        self._done: list[pa.RecordBatch] = []  # batches of rows before those in `_cols`
        self._rows = 0

    def __len__(self) -> int:
        return self._rows

    def add(self, offset: int, timestamp: int, key: bytes | None, value: bytes | None,
            old_key: bytes | None = None) -> None:  # fmt: skip
        self._rows += 1
        key_part = self._split(key, self._head["key"])
        value_part = self._split(value, self._head["value"]) if key_part is not None else None
        if key_part is None or value_part is None:
            self._add_row(record_row(self.seen, self.topic, self.partition, offset, timestamp,
                                     key, value, old_key))  # fmt: skip
            for side in ("key", "value"):
                last = self.seen.last(side)
                if last is not None:
                    self._head[side] = (_HEAD + last[0] + _SEP, last[1])
            return
        c = self._cols
        c["topic"].append(self.topic)
        c["partition"].append(self.partition)
        c["offset"].append(offset)
        c["timestamp"].append(timestamp)
        c["key_schema_id"].append(key_part[0])
        c["key_schema"].append(None)
        c["key_payload"].append(key_part[1])
        c["value_schema_id"].append(value_part[0])
        c["value_schema"].append(None)
        c["value_payload"].append(value_part[1])
        c["is_tombstone"].append(value is None)
        c["error"].append(None)
        c["old_key"].append(None if old_key is None else old_key.decode("utf-8", "replace"))

    def add_many(self, offsets, timestamps, keys, values, old_keys=None) -> None:
        """`add` of each record, in order, from Arrow arrays (or lists): each run of
        records that split with the last schemas and have no `old_keys` is split by Arrow
        compute functions."""
        import pyarrow as pa

        offsets, timestamps = _array(offsets, pa.int64()), _array(timestamps, pa.int64())
        keys, values = _array(keys, pa.binary()), _array(values, pa.binary())
        olds = [None] * len(offsets) if old_keys is None else list(old_keys)
        start, n = 0, len(offsets)
        while start < n:
            end = self._run(keys, values, start)
            if old_keys is not None:  # a record with an old key goes one at a time
                end = next((i for i in range(start, end) if olds[i] is not None), end)
            if end > start:
                self._add_run(offsets, timestamps, keys, values, start, end)
                start = end
            if start < n:  # another schema, no envelope or an old key: one at a time
                self.add(offsets[start].as_py(), timestamps[start].as_py(),
                         keys[start].as_py(), values[start].as_py(), olds[start])  # fmt: skip
                start += 1

    def _run(self, keys: pa.Array, values: pa.Array, start: int) -> int:
        """The end of the run of records from `start` that split with the last schemas."""
        import pyarrow.compute as pc

        ok = None
        for side, data in (("key", keys), ("value", values)):
            data = data.slice(start)
            head = self._head[side]
            if head is None:
                fits = pc.is_null(data)
            else:
                fits = pc.and_kleene(pc.starts_with(data, pattern=head[0]),
                                     pc.ends_with(data, pattern="}"))  # fmt: skip
                fits = pc.fill_null(fits, True)  # no data: nothing to split
            ok = fits if ok is None else pc.and_(ok, fits)
        bad = pc.index(ok, False).as_py()
        return len(keys) if bad < 0 else start + bad

    def _add_run(self, offsets, timestamps, keys, values, start: int, end: int) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        n = end - start
        cols: dict[str, pa.Array] = {
            "topic": pa.array([self.topic] * n, pa.string()),
            "partition": pa.array([self.partition] * n, pa.int32()),
            "offset": offsets.slice(start, n),
            "timestamp": timestamps.slice(start, n),
        }
        for side, data in (("key", keys), ("value", values)):
            data = data.slice(start, n)
            head = self._head[side]
            cols[f"{side}_schema"] = pa.nulls(n, pa.string())
            if head is None:  # every record of the run has no data on this side
                cols[f"{side}_schema_id"] = pa.nulls(n, pa.int64())
                cols[f"{side}_payload"] = pa.nulls(n, pa.string())
                continue
            valid = pc.is_valid(data)
            cols[f"{side}_schema_id"] = pc.if_else(valid, pa.scalar(head[1], pa.int64()),
                                                   pa.scalar(None, pa.int64()))  # fmt: skip
            try:
                payload = pc.binary_slice(data, len(head[0]), -1).cast(pa.string())
            except pa.ArrowInvalid:  # not UTF-8: the records go one at a time
                for i in range(start, end):
                    self.add(offsets[i].as_py(), timestamps[i].as_py(), keys[i].as_py(),
                             values[i].as_py())  # fmt: skip
                return
            cols[f"{side}_payload"] = payload
        cols["is_tombstone"] = pc.is_null(values.slice(start, n))
        cols["error"] = pa.nulls(n, pa.string())
        cols["old_key"] = pa.nulls(n, pa.string())
        self._flush()
        self._done.append(pa.RecordBatch.from_pydict(cols, schema=_arrow_schema()))
        self._rows += n

    @staticmethod
    def _split(data: bytes | None, head: tuple[bytes, int] | None):
        """(schema id, payload text) of a record side with the last schema ((None, None)
        for no data), or None when it needs the general path."""
        if data is None:
            return (None, None)
        if head is None or not data.startswith(head[0]) or not data.endswith(b"}"):
            return None
        try:
            return (head[1], data[len(head[0]) : -1].decode("utf-8"))
        except UnicodeDecodeError:
            return None

    def _add_row(self, row: dict[str, object]) -> None:
        for name, values in self._cols.items():
            values.append(row[name])

    def _flush(self) -> None:
        """The rows in `_cols` into a batch of `_done`."""
        import pyarrow as pa

        if self._cols["offset"]:
            self._done.append(pa.RecordBatch.from_pydict(self._cols, schema=_arrow_schema()))
            self._cols = {name: [] for name in _COLUMNS}

    def batch(self) -> pa.RecordBatch:
        """The rows gathered since the last batch, as one Arrow batch."""
        import pyarrow as pa

        self._flush()
        done, self._done, self._rows = self._done, [], 0
        if not done:
            return pa.RecordBatch.from_pydict(self._cols, schema=_arrow_schema())
        if len(done) == 1:
            return done[0]
        return pa.Table.from_batches(done).combine_chunks().to_batches()[0]


def _array(values, kind):
    """`values` as one Arrow array of `kind`."""
    import pyarrow as pa

    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    return values if isinstance(values, pa.Array) else pa.array(values, kind)
