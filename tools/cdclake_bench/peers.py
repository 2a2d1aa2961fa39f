"""What the load job is compared with, on the same recorded events.

- `peer_handler`: the pydbzengine Iceberg handler's way (pyiceberg), as it runs: the
  Debezium engine hands the handler `HANDLER_BATCH` events a call (its `max.batch.size`
  default), in the order they were captured; for each table of a call, the handler's own
  decode (`pyarrow.json.read_json` of the payloads, as `IcebergChangeHandlerV2` does),
  then pyiceberg `Table.upsert` of the latest row per key and `Table.delete` of deleted
  keys. The handler in pydbzengine 3.6.3.0 only appends raw events (its upsert is
  disabled), so the upsert step is pyiceberg's documented one. Each upsert reads the
  table's rows of the call's keys, so calls slow down as the tables grow: the peer stops
  after the call that passes a time budget, and its rate is that of the events it applied
  (in its favour: the later calls are the slower ones).
- `peer_upsert`: the same decode and upsert with each table's events in one call (what
  the handler never gets, in its favour), from the raw records as they sit in the topic:
  splitting each envelope into its payload and reading its key are timed. With
  `populated`, the tables first get another recording's events (untimed): the steady
  state, an upsert into tables that hold the keys.
- The handler gets the payloads without their schema; every peer's tables are created
  beforehand, untimed, from every payload's inferred schema (in their favour too).
- `naive_merge`: Spark with no tuning: schema inferred by `spark.read.json`, latest row
  per key by a window, one `MERGE INTO` per table (copy-on-write, default settings).
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

from cdclake.offsets import OffsetRange
from cdclake.raw_rows import split_envelope

from cdclake_bench.sources import _file_name


def _records(rec: Path, ranges: list[OffsetRange], topic: str):
    """The records of the topic's ranges (a recording's file may hold more)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = []
    for r in ranges:
        if r.topic == topic:
            within = [("offset", ">=", r.start), ("offset", "<", r.end)]
            t = pq.read_table(rec / _file_name(r.topic, r.partition), filters=within)
            parts.append(t.append_column("partition", pa.array([r.partition] * t.num_rows,
                                                                pa.int32())))  # fmt: skip
    return pa.concat_tables(parts)


# the Debezium engine's `max.batch.size` default: the events of one handler call
HANDLER_BATCH = 2048


def _inputs(rec: Path, ranges: list[OffsetRange]) -> dict[str, tuple]:
    """Per topic, what the handler receives: the payload text of each record (None for
    a tombstone), its key's id, and its capture time (the record's timestamp)."""
    inputs = {}
    for topic in sorted({r.topic for r in ranges}):
        t = _records(rec, ranges, topic)
        payloads = [split_envelope(v)[1] if v is not None else None
                    for v in t.column("value").to_pylist()]  # fmt: skip
        keys = [json.loads(split_envelope(k)[1])["id"] for k in t.column("key").to_pylist()]
        inputs[topic] = (payloads, keys, t.column("timestamp").to_pylist())
    return inputs


def _create_tables(catalog, namespace: str, inputs: dict[str, tuple]) -> dict:
    """Each topic's table, keyed by `id`, with the schema `read_json` infers from all of
    its payloads."""
    from pyarrow import json as pa_json

    catalog.create_namespace_if_not_exists(namespace)
    tables = {}
    for topic, (payloads, _, _) in inputs.items():
        lines = b"\n".join(p for p in payloads if p is not None)
        after = pa_json.read_json(io.BytesIO(lines)).column("after").combine_chunks()
        schema = after.type
        name = (namespace, topic.rsplit(".", 1)[1])
        table = catalog.create_table(name, schema=_arrow_schema(schema))
        with table.update_schema(allow_incompatible_changes=True) as u:
            u.update_column("id", required=True)
            u.set_identifier_fields("id")
        tables[topic] = catalog.load_table(name)
    return tables


def _arrow_schema(struct):
    import pyarrow as pa

    return pa.schema([struct.field(i) for i in range(struct.num_fields)])


def _apply(table, payloads: list, keys: list) -> None:
    """One handler call's events of one table: decode, latest row per key, upsert,
    delete."""
    import pyarrow as pa
    from pyarrow import json as pa_json
    from pyiceberg.expressions import In

    lines = b"\n".join(p for p in payloads if p is not None)
    events = pa_json.read_json(io.BytesIO(lines)) if lines else None
    ops = events.column("op").to_pylist() if events is not None else []
    latest: dict[int, int | None] = {}  # key -> row index in events, None = deleted
    row = 0
    for key, payload in zip(keys, payloads, strict=True):
        if payload is None:  # tombstone: the delete before it holds the change
            latest[key] = None
            continue
        latest[key] = None if ops[row] == "d" else row
        row += 1
    upsert_rows = sorted(i for i in latest.values() if i is not None)
    deleted = [k for k, i in latest.items() if i is None]
    if upsert_rows:
        after = events.column("after").combine_chunks()
        rows = pa.Table.from_struct_array(after.take(pa.array(upsert_rows, pa.int64())))
        table.upsert(rows.cast(table.schema().as_arrow()), join_cols=["id"])
    if deleted:
        table.delete(In("id", deleted))


def peer_handler(
    catalog, namespace: str, rec: Path, ranges: list[OffsetRange], budget_s: float,
    batch: int = HANDLER_BATCH,
) -> tuple[int, int, float]:  # fmt: skip
    """(events applied, handler calls, seconds): the recorded events handed to the
    handler `batch` at a time, in capture order, until every event is applied or a call
    ends past `budget_s` seconds."""
    inputs = _inputs(rec, ranges)
    tables = _create_tables(catalog, namespace, inputs)
    order = sorted((ts, topic, i) for topic, (_, _, stamps) in inputs.items()
                   for i, ts in enumerate(stamps))  # fmt: skip
    applied = calls = 0
    started = time.perf_counter()
    for start in range(0, len(order), batch):
        call = order[start : start + batch]
        for topic in inputs:
            mine = [i for _, t, i in call if t == topic]
            if mine:
                payloads, keys, _ = inputs[topic]
                _apply(tables[topic], [payloads[i] for i in mine], [keys[i] for i in mine])
        applied, calls = applied + len(call), calls + 1
        if time.perf_counter() - started > budget_s:
            break
    return applied, calls, time.perf_counter() - started


def peer_upsert(catalog, namespace: str, rec: Path, ranges: list[OffsetRange],
                populated: tuple[Path, list[OffsetRange]] | None = None,
                prepare=None) -> float:  # fmt: skip
    """Seconds to apply every recorded event with pyiceberg upsert + delete, each
    table's events in one call, from the raw records (their split and keys timed);
    `populated`: a recording (and its ranges) applied first, untimed; `prepare`: called
    with the tables' names (`namespace.table`) after it, untimed."""
    started = time.perf_counter()
    inputs = _inputs(rec, ranges)
    split_s = time.perf_counter() - started
    before = _inputs(*populated) if populated else {}
    every = {t: (inputs[t][0] + (before[t][0] if t in before else []), None, None)
             for t in inputs}  # fmt: skip
    tables = _create_tables(catalog, namespace, every)
    for topic, (payloads, keys, _) in before.items():
        _apply(tables[topic], payloads, keys)
    if prepare is not None:
        prepare([".".join(t.name()[-2:]) for t in tables.values()])
        tables = {topic: catalog.load_table(tuple(t.name()[-2:])) for topic, t in tables.items()}
    started = time.perf_counter()
    for topic, (payloads, keys, _) in inputs.items():
        _apply(tables[topic], payloads, keys)
    return split_s + time.perf_counter() - started


def naive_merge(spark, catalog_name: str, namespace: str, rec: Path,
                ranges: list[OffsetRange]) -> float:  # fmt: skip
    """Seconds for the untuned Spark job: infer, window, one MERGE per table."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog_name}.{namespace}")
    started = time.perf_counter()
    defaults = {"spark.sql.shuffle.partitions": "200", "spark.sql.adaptive.enabled": "false"}
    saved = {k: spark.conf.get(k) for k in defaults}
    for k, v in defaults.items():
        spark.conf.set(k, v)
    try:
        for topic in sorted({r.topic for r in ranges}):
            files = [str(rec / _file_name(r.topic, r.partition)) for r in ranges
                     if r.topic == topic]  # fmt: skip
            raw = spark.read.parquet(*files).where(F.col("value").isNotNull())
            docs = spark.read.json(
                raw.select(F.col("value").cast("string")).rdd.map(lambda r: r[0])
            )
            rows = docs.select(
                "payload.op",
                "payload.after.*",
                F.col("payload.before.id").alias("_bid"),
                F.col("payload.source.lsn").alias("_lsn"),
            )
            rows = rows.withColumn("id", F.coalesce("id", "_bid"))
            w = Window.partitionBy("id").orderBy(F.col("_lsn").desc())
            latest = (
                rows.withColumn("_n", F.row_number().over(w)).where("_n = 1").drop("_n", "_bid")
            )
            table = f"{catalog_name}.{namespace}.{topic.rsplit('.', 1)[1]}"
            latest.createOrReplaceTempView("naive_changes")
            spark.sql(f"CREATE TABLE IF NOT EXISTS {table} USING iceberg AS "
                      "SELECT * FROM naive_changes WHERE false")  # fmt: skip
            spark.sql(
                f"MERGE INTO {table} t USING naive_changes s ON t.id = s.id "
                "WHEN MATCHED AND s.op = 'd' THEN DELETE WHEN MATCHED THEN UPDATE SET * "
                "WHEN NOT MATCHED AND s.op != 'd' THEN INSERT *"
            )
    finally:
        for k, v in saved.items():
            spark.conf.set(k, v)
    return time.perf_counter() - started
