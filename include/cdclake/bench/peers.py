"""What the load job is compared with, on the same recorded events.

- `peer_upsert`: the pydbzengine Iceberg handler's way (pyiceberg): the handler's own
  decode (`pyarrow.json.read_json` of the payloads, as `IcebergChangeHandlerV2` does), then
  pyiceberg `Table.upsert` of the latest row per key and `Table.delete` of deleted keys.
  The handler in pydbzengine 3.6.3.0 only appends raw events (its upsert is disabled), so
  the upsert step is pyiceberg's documented one; it gets each table's events in one call
  and the payloads without their schema (both in its favour).
- `naive_merge`: Spark with no tuning: schema inferred by `spark.read.json`, latest row
  per key by a window, one `MERGE INTO` per table (copy-on-write, default settings).
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

from cdclake.bench.sources import _file_name
from cdclake.offsets import OffsetRange
from cdclake.reader import split_envelope


def _records(rec: Path, ranges: list[OffsetRange], topic: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = [pq.read_table(rec / _file_name(r.topic, r.partition)).append_column(
        "partition", pa.array([r.partition] * (r.end - r.start), pa.int32()))
        for r in ranges if r.topic == topic]  # fmt: skip
    return pa.concat_tables(parts)


def peer_upsert(catalog, namespace: str, rec: Path, ranges: list[OffsetRange]) -> float:
    """Seconds to apply every recorded event with pyiceberg upsert + delete."""
    import pyarrow as pa
    from pyarrow import json as pa_json
    from pyiceberg.expressions import In

    catalog.create_namespace_if_not_exists(namespace)
    topics = sorted({r.topic for r in ranges})
    inputs = {}
    for topic in topics:  # the handler receives payload text; not timed
        t = _records(rec, ranges, topic)
        payloads = [split_envelope(v)[1] if v is not None else None
                    for v in t.column("value").to_pylist()]  # fmt: skip
        keys = [json.loads(split_envelope(k)[1])["id"] for k in t.column("key").to_pylist()]
        inputs[topic] = (payloads, keys)
    started = time.perf_counter()
    for topic in topics:
        payloads, keys = inputs[topic]
        lines = b"\n".join(p for p in payloads if p is not None)
        events = pa_json.read_json(io.BytesIO(lines))
        ops = events.column("op").to_pylist()
        after = events.column("after").combine_chunks()
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
        rows = pa.Table.from_struct_array(after.take(pa.array(upsert_rows, pa.int64())))
        name = (namespace, topic.rsplit(".", 1)[1])
        if not catalog.table_exists(name):
            table = catalog.create_table(name, schema=rows.schema)
            with table.update_schema(allow_incompatible_changes=True) as u:
                u.update_column("id", required=True)
                u.set_identifier_fields("id")
            table = catalog.load_table(name)
        else:
            table = catalog.load_table(name)
        rows = rows.cast(table.schema().as_arrow())
        table.upsert(rows, join_cols=["id"])
        if deleted:
            table.delete(In("id", deleted))
    return time.perf_counter() - started


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
