"""Kafka metadata for planning: partitions and watermarks, with errors naming the broker."""

from __future__ import annotations

from collections.abc import Iterable

from cdclake.config import KafkaConfig
from cdclake.exceptions import EndpointError
from cdclake.offsets import TopicPartition, Watermarks


def fetch_watermarks(
    kafka: KafkaConfig, topics: Iterable[str], timeout: float = 15.0
) -> dict[TopicPartition, Watermarks]:
    """Low and high watermarks of every partition of `topics` that exist."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer(
        {**kafka.client_config(), "group.id": "cdclake-planner", "enable.auto.commit": False}
    )
    try:
        try:
            meta = consumer.list_topics(timeout=timeout)
        except KafkaException as exc:
            raise EndpointError(
                f"Kafka at {kafka.bootstrap_servers} could not be reached: {exc}"
            ) from exc
        out: dict[tuple[str, int], Watermarks] = {}
        for topic in topics:
            tmeta = meta.topics.get(topic)
            if tmeta is None or tmeta.error is not None:
                continue
            for p in sorted(tmeta.partitions):
                try:
                    low, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, p), timeout=timeout
                    )
                except KafkaException as exc:
                    raise EndpointError(
                        f"Kafka at {kafka.bootstrap_servers}: watermarks of {topic}[{p}]: {exc}"
                    ) from exc
                out[(topic, p)] = Watermarks(low, high)
        return out
    finally:
        consumer.close()
