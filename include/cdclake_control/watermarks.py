"""Kafka's offsets as the control side reads them: each partition's watermarks, and the
first offset at or after a time (a backfill's start)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from cdclake.config import KafkaConfig
from cdclake.exceptions import EndpointError
from cdclake.kafka.topics import topic_metadata
from cdclake.offsets import TopicPartition, Watermarks


def fetch_watermarks(
    kafka: KafkaConfig, topics: Iterable[str], timeout: float | None = None
) -> dict[TopicPartition, Watermarks]:
    """Low and high watermarks of every partition of `topics` that exist."""
    from confluent_kafka import KafkaException, TopicPartition

    with topic_metadata(kafka, timeout) as (consumer, meta):
        out: dict[tuple[str, int], Watermarks] = {}
        for topic in topics:
            tmeta = meta.topics.get(topic)
            if tmeta is None or tmeta.error is not None:
                continue
            for p in sorted(tmeta.partitions):
                try:
                    low, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, p), timeout=timeout or kafka.timeouts.request_s
                    )
                except KafkaException as exc:
                    raise EndpointError(
                        f"Kafka at {kafka.servers}: watermarks of {topic}[{p}]: {exc}"
                    ) from exc
                out[(topic, p)] = Watermarks(low, high)
        return out


def offsets_for_time(
    kafka: KafkaConfig,
    marks: dict[TopicPartition, Watermarks],
    timestamp_ms: int,
    timeout: float | None = None,
) -> dict[TopicPartition, int]:
    """Per partition, the first offset whose record timestamp is at or after `timestamp_ms`
    (the high watermark when there is none).

    Found by bisecting the records themselves rather than with the broker's ListOffsets by
    time, which some Kafka-protocol brokers answer wrongly; it assumes record timestamps do
    not go backwards within a partition, as with one producer per partition (Debezium).
    """
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTP

    timeout = kafka.timeouts.request_s if timeout is None else timeout
    consumer = Consumer(
        {
            **kafka.client_config(),
            "group.id": "cdclake-planner",
            "enable.auto.commit": False,
            "fetch.max.bytes": 1 << 20,
        }
    )

    def timestamp_at(tp: TopicPartition, offset: int) -> int:
        consumer.assign([KafkaTP(tp[0], tp[1], offset)])
        deadline = timeout
        while deadline > 0:
            msg = consumer.poll(1.0)
            deadline -= 1.0
            if msg is None:
                continue
            if msg.error():
                raise EndpointError(
                    f"Kafka at {kafka.servers}: reading {tp[0]}[{tp[1]}]@{offset}: {msg.error()}"
                )
            if cast(int, msg.offset()) >= offset:  # a record's: set
                return msg.timestamp()[1]
        raise EndpointError(
            f"Kafka at {kafka.servers}: no record at {tp[0]}[{tp[1]}]@{offset} within "
            f"{timeout:g}s (timeouts.request_s)"
        )

    try:
        out: dict[TopicPartition, int] = {}
        for tp, m in sorted(marks.items()):
            lo, hi = m.low, m.high  # answer in [lo, hi]
            while lo < hi:
                mid = (lo + hi) // 2
                if timestamp_at(tp, mid) >= timestamp_ms:
                    hi = mid
                else:
                    lo = mid + 1
            out[tp] = lo
        return out
    finally:
        consumer.close()
