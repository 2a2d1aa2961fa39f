"""How far behind a lake table is: the records Kafka holds past its committed offsets, and
how long ago the oldest of them changed the source.

"Behind source" is the age of the oldest change the lake does not hold yet: per table, 0
when every partition's committed offset is its end offset; else now minus the time of the
first record past the committed offset, the oldest over the table's partitions. The time
is the change's commit time in PostgreSQL (`source.ts_ms` of the Debezium envelope), so
a connector that fell behind the WAL shows too; a record without one (a tombstone, a
value that is not a JSON envelope) counts with its Kafka timestamp (when Kafka Connect
produced it).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import cast

from cdclake.config import KafkaConfig
from cdclake.exceptions import EndpointError
from cdclake.offsets import TopicPartition, Watermarks

log = logging.getLogger(__name__)

# records smaller than this are read whole; one record per partition is all we need
_FETCH_BYTES = 1 << 16


def offsets_behind(
    marks: Mapping[TopicPartition, Watermarks], topic: str, committed: Mapping[TopicPartition, int]
) -> int:
    """Records Kafka holds for `topic` past the committed offsets (from the low watermark
    for a partition never committed)."""
    return sum(
        max(0, m.high - committed.get(tp, m.low)) for tp, m in marks.items() if tp[0] == topic
    )


def unloaded_starts(
    marks: Mapping[TopicPartition, Watermarks], committed: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """Per partition with records past its committed offset, the offset of the first one
    (the low watermark when retention removed the committed one, or nothing was committed)."""
    out = {}
    for tp, m in marks.items():
        start = max(committed.get(tp, m.low), m.low)
        if start < m.high:
            out[tp] = start
    return out


def source_time_ms(value: bytes | None) -> int | None:
    """`source.ts_ms` of a Debezium JSON value, with or without its schema (`__source_ts_ms`
    when flattened); None for a tombstone or a value that holds none."""
    if not value:
        return None
    try:
        doc = json.loads(value)
    except ValueError:
        return None
    if isinstance(doc, dict) and "payload" in doc and "schema" in doc:
        doc = doc["payload"]
    if not isinstance(doc, dict):
        return None
    source = doc.get("source")
    ts = source.get("ts_ms") if isinstance(source, dict) else doc.get("__source_ts_ms")
    return ts if isinstance(ts, int) and not isinstance(ts, bool) else None


def record_time_ms(value: bytes | None, kafka_timestamp: tuple[int, int]) -> int | None:
    """When the change of a record happened: its source commit time, else its Kafka
    timestamp (`(type, ms)` as confluent-kafka gives it; type 0 means none)."""
    ts = source_time_ms(value)
    if ts is not None:
        return ts
    kind, ms = kafka_timestamp
    return ms if kind != 0 and ms >= 0 else None


def seconds_behind_source(oldest_ms: int | None, waiting: bool, now_ms: int) -> float | None:
    """0 when nothing waits; else the age of the oldest waiting change (None: its time is
    unknown). A source clock ahead of ours never gives a negative age."""
    if not waiting:
        return 0.0
    if oldest_ms is None:
        return None
    return max(0.0, (now_ms - oldest_ms) / 1000)


def oldest_per_topic(times: Mapping[TopicPartition, int | None]) -> dict[str, int | None]:
    """Per topic of `times` (the first waiting record of each partition that has one): the
    oldest time, or None when one of them has none."""
    grouped: dict[str, list[int | None]] = {}
    for (topic, _), t in times.items():
        grouped.setdefault(topic, []).append(t)
    return {topic: None if None in ts else min(ts) for topic, ts in grouped.items()}  # type: ignore[type-var]


def first_record_times(
    kafka: KafkaConfig,
    starts: Mapping[TopicPartition, int],
    marks: Mapping[TopicPartition, Watermarks],
    timeout: float | None = None,
) -> dict[TopicPartition, int | None]:
    """The time (`record_time_ms`) of the record at each partition's start offset, read
    with one consumer over all partitions at once, within `timeout` seconds (the pipeline's
    `timeouts.request_s` by default). A partition whose range holds no record (only
    transaction markers) is left out."""
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka import TopicPartition as KafkaTP

    if not starts:
        return {}
    timeout = kafka.timeouts.request_s if timeout is None else timeout
    consumer = Consumer(
        {
            **kafka.client_config(),
            "group.id": "cdclake-freshness",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",  # a start retention removed meanwhile
            "fetch.max.bytes": _FETCH_BYTES * 16,
            "max.partition.fetch.bytes": _FETCH_BYTES,
        }
    )
    out: dict[TopicPartition, int | None] = {}
    done: set[TopicPartition] = set()
    try:
        consumer.assign([KafkaTP(t, p, o) for (t, p), o in sorted(starts.items())])
        deadline = time.monotonic() + timeout
        while len(done) < len(starts) and (left := deadline - time.monotonic()) > 0:
            for msg in consumer.consume(num_messages=100, timeout=min(1.0, left)):
                tp = cast("tuple[str, int]", (msg.topic(), msg.partition()))  # a record's: set
                if tp not in starts or tp in done:
                    continue
                err = msg.error()
                if err is not None and err.code() != KafkaError._PARTITION_EOF:
                    raise EndpointError(
                        f"Kafka at {kafka.servers}: reading {tp[0]}[{tp[1]}]@{starts[tp]}: {err}"
                    )
                if err is None and cast(int, msg.offset()) < starts[tp]:
                    continue
                if err is None and cast(int, msg.offset()) < marks[tp].high:
                    out[tp] = record_time_ms(msg.value(), msg.timestamp())
                done.add(tp)
                consumer.pause([KafkaTP(*tp)])
    finally:
        consumer.close()
    missing = sorted(set(starts) - done)
    if missing:
        t, p = missing[0]
        raise EndpointError(
            f"Kafka at {kafka.servers} did not return the record at {t}[{p}]@{starts[(t, p)]} "
            f"within {timeout:g}s ({len(missing)} partition(s) unread)"
        )
    return out


def source_lag(
    kafka: KafkaConfig,
    marks: Mapping[TopicPartition, Watermarks],
    committed: Mapping[str, Mapping[TopicPartition, int]],
    now_ms: int,
) -> dict[str, float | None]:
    """Seconds behind source (`seconds_behind_source`) per topic of `committed` (its
    committed offsets), reading one record per partition that has records waiting."""
    starts: dict[TopicPartition, int] = {}
    for topic, offsets in committed.items():
        starts |= unloaded_starts({tp: m for tp, m in marks.items() if tp[0] == topic}, offsets)
    oldest = oldest_per_topic(first_record_times(kafka, starts, marks))
    return {t: seconds_behind_source(oldest.get(t), t in oldest, now_ms) for t in committed}
