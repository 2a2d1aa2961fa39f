"""Benchmark inputs for the load job: raw Kafka records from a recorded file, or generated
inside the executors, as `RawSource`s like the Kafka one (`reader.KAFKA`): the same raw
rows, read the same ways (in slices, or a range per task to resolve it whole).

A recording is a directory with one Parquet file per topic-partition (columns offset,
timestamp, key, value; row groups in offset order) and `ranges.json`, the offset ranges
it holds. Each Spark task reads one slice or range of one file, so the job reads files
the way it reads Kafka partitions.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from cdclake.kafka.reader import RawSource
from cdclake.offsets import OffsetRange
from cdclake.raw_rows import RawRows

from cdclake_bench.events import Workload, generate_slice


def _file_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}.parquet"


def record_workload(workload: Workload, out: Path, log_every: int = 100_000) -> list[OffsetRange]:
    """Generate the workload into `out` (a directory); returns its offset ranges."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("offset", pa.int64()), ("timestamp", pa.int64()),
                        ("key", pa.binary()), ("value", pa.binary())])  # fmt: skip
    ranges, done = [], 0
    for topic, partition, count in workload.slices():
        alive: set[int] = set()
        with pq.ParquetWriter(out / _file_name(topic, partition), schema,
                              compression="zstd") as writer:  # fmt: skip
            for cols in generate_slice(workload, topic, partition, 0, count, alive):
                writer.write_batch(pa.RecordBatch.from_pydict(cols, schema=schema))
                done += len(cols["offset"])
                if log_every and done % log_every < len(cols["offset"]):
                    print(f"  recorded {done:,} events", flush=True)
        ranges.append(OffsetRange(topic, partition, 0, count))
    (out / "ranges.json").write_text(
        json.dumps([[r.topic, r.partition, r.start, r.end] for r in ranges])
    )
    return ranges


def flatten_recording(source: Path, out: Path) -> None:
    """A copy of the recording in `source` with each change flattened as Debezium's
    ExtractNewRecordState writes it (`flat_value`)."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for path in sorted(source.glob("*.parquet")):
        table = pq.read_table(path)
        values = [None if v is None else flat_value(v) for v in table.column("value").to_pylist()]
        table = table.set_column(table.schema.get_field_index("value"), "value",
                                 pa.array(values, pa.binary()))  # fmt: skip
        pq.write_table(table, out / path.name, compression="zstd")
    shutil.copy(source / "ranges.json", out / "ranges.json")


FLAT_FIELDS = [{"type": "string", "optional": True, "field": "__op"},
               {"type": "int64", "optional": True, "field": "__lsn"},
               {"type": "int64", "optional": True, "field": "__source_ts_ms"},
               {"type": "string", "optional": True, "field": "__deleted"}]  # fmt: skip


def flat_value(value: bytes) -> bytes:
    """A change event's value as ExtractNewRecordState writes it with
    add.fields=op,lsn,source.ts_ms and deletes rewritten: the row (a delete's before)
    and those fields."""
    event = json.loads(value)
    payload = event["payload"]
    op = payload["op"]
    row_schema = next(f for f in event["schema"]["fields"] if f["field"] == "after")
    row = payload["before"] if op == "d" else payload["after"]
    schema = {"type": "struct", "optional": False, "name": row_schema.get("name"),
              "fields": row_schema["fields"] + FLAT_FIELDS}  # fmt: skip
    source = payload.get("source") or {}
    flat = {**(row or {}), "__op": op, "__lsn": source.get("lsn"),
            "__source_ts_ms": source.get("ts_ms"), "__deleted": str(op == "d").lower()}  # fmt: skip
    return json.dumps({"schema": schema, "payload": flat}, separators=(",", ":")).encode()


def recorded_ranges(directory: Path) -> list[OffsetRange]:
    return [OffsetRange(*r) for r in json.loads((directory / "ranges.json").read_text())]


def split_recording(directory: Path, ranges: list[OffsetRange]) -> tuple[Path, Path]:
    """Two recordings over the files of `directory`: each topic-partition's first half
    of `ranges` (`<directory>/first`) and its second half (`<directory>/second`), two
    batches of one history."""
    first, second = directory / "first", directory / "second"
    cuts: dict[Path, list] = {first: [], second: []}
    for r in ranges:
        mid = r.start + r.size // 2
        cuts[first].append([r.topic, r.partition, r.start, mid])
        cuts[second].append([r.topic, r.partition, mid, r.end])
    for half, cut in cuts.items():
        half.mkdir()
        for r in ranges:
            name = _file_name(r.topic, r.partition)
            (half / name).symlink_to(directory.resolve() / name)  # valid from any cwd
        (half / "ranges.json").write_text(json.dumps(cut))
    return first, second


def _raw_batch(cols, rows: RawRows):
    """Recorded or generated columns (a dict of lists, or an Arrow table) -> the reader's
    raw rows (same code path)."""
    rows.add_many(cols["offset"], cols["timestamp"], cols["key"], cols["value"])
    return rows.batch()


def file_reader(directory: Path) -> RawSource:
    """A source for `run_batch` that takes the records from a recording."""
    return RawSource(partial(_file_ranges, str(directory)))


def _file_ranges(where: str, kafka) -> Callable[[dict], Iterator]:
    return partial(_read_file_slice, where, kafka.format, kafka.schema_registry)


def _read_file_slice(where: str, fmt, registry, r: dict) -> Iterator:
    import numpy as np
    import pyarrow.parquet as pq

    f = pq.ParquetFile(f"{where}/{_file_name(r['topic'], r['partition'])}")
    raw = fmt.raw_rows(r["topic"], r["partition"], registry)  # split as the format says
    first = 0
    for g in range(f.num_row_groups):
        rows = f.metadata.row_group(g).num_rows
        if first + rows > r["start"] and first < r["end"]:
            t = f.read_row_group(g, use_threads=False)
            # offsets ascend within a file: cut the slice's rows out without copying
            # (a filter would copy every ~4 KB value)
            offsets = t["offset"].to_numpy()
            lo, hi = np.searchsorted(offsets, [r["start"], r["end"]])
            t = t.slice(lo, hi - lo)
            yield _raw_batch(t, raw)
        first += rows


def generated_reader(workload: Workload) -> RawSource:
    """A source that generates the workload's records inside the executors (for batches
    too big to record)."""
    return RawSource(partial(_generated_ranges, workload))


def _generated_ranges(workload: Workload, kafka) -> Callable[[dict], Iterator]:
    return partial(_generate_range, workload)


def _generate_range(workload: Workload, r: dict) -> Iterator:
    raw = RawRows(r["topic"], r["partition"])
    for cols in generate_slice(workload, r["topic"], r["partition"], r["start"], r["end"]):
        yield _raw_batch(cols, raw)


def produce_workload(client_config: dict, workload: Workload) -> list[OffsetRange]:
    """Produce the workload to Kafka, with the producer's default batching."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(client_config)
    futures = admin.create_topics(
        [NewTopic(s.topic, workload.partitions, 1) for s in workload.streams]
    )
    for f in futures.values():
        f.result()
    producer = Producer({**client_config, "acks": "all"})
    ranges = []
    for topic, partition, count in workload.slices():
        for cols in generate_slice(workload, topic, partition, 0, count, set()):
            for key, value, ts in zip(cols["key"], cols["value"], cols["timestamp"], strict=True):
                while True:
                    try:
                        producer.produce(topic, value, key, partition=partition, timestamp=ts)
                        break
                    except BufferError:
                        producer.poll(0.1)
        producer.flush(600)
        ranges.append(OffsetRange(topic, partition, 0, count))
    return ranges


_FILL_BY_TYPE = {
    "bigint": "id", "int": "cast(id % 1000 as int)", "boolean": "true",
    "timestamp": "current_timestamp()", "timestamp_ntz": "localtimestamp()",
    "date": "current_date()",
}  # fmt: skip


def fill_select(spark, table: str, rows: int, start: int = 1) -> str:
    """SELECT of `rows` rows for every column of `table`, keys from `start`, text of the
    size the templates have."""
    exprs = []
    for f in spark.table(table).schema.fields:
        kind = f.dataType.simpleString()
        if f.name == "id":
            expr = "id"
        elif f.name == "_cdc_lsn":
            expr = "1"
        elif f.name == "_cdc_op":
            expr = "'r'"
        elif kind == "string":
            expr = (
                "concat_ws(' ', sha2(cast(id as string), 256), sha2(cast(id + 1 as string), 256))"
            )
        elif kind.startswith("decimal"):
            expr = f"cast(id % 1000 as {kind})"
        else:
            expr = _FILL_BY_TYPE.get(kind, f"cast(null as {kind})")
        exprs.append(f"cast({expr} as {kind}) as `{f.name}`")
    return f"SELECT {', '.join(exprs)} FROM range({start}, {start + rows})"
