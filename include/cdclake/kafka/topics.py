"""Kafka metadata for planning: partitions and watermarks, with errors naming the broker."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

from cdclake.config import KafkaConfig, PipelineConfig
from cdclake.exceptions import EndpointError

if TYPE_CHECKING:
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka.admin._metadata import ClusterMetadata


@contextmanager
def topic_metadata(
    kafka: KafkaConfig, timeout: float | None
) -> Iterator[tuple[Consumer, ClusterMetadata]]:
    """A planner consumer and the cluster's topic metadata; an unreachable broker is an
    EndpointError naming it. `timeout` defaults to the pipeline's `timeouts.request_s`."""
    from confluent_kafka import Consumer

    errors: list[KafkaError] = []  # librdkafka's reports on its connections (error_cb)
    consumer = Consumer(
        {
            **kafka.client_config(),
            "group.id": "cdclake-planner",
            "enable.auto.commit": False,
            "error_cb": errors.append,
        }
    )
    try:
        yield consumer, _topics(kafka, consumer, errors, timeout)
    finally:
        consumer.close()


def _topics(
    kafka: KafkaConfig, consumer: Consumer, errors: list[KafkaError], timeout: float | None
) -> ClusterMetadata:
    """The cluster's topic metadata, asked for a second at a time so that brokers that
    all refused or timed out their connections fail at once, not after `timeout`."""
    from confluent_kafka import KafkaError, KafkaException

    timeout = kafka.timeouts.request_s if timeout is None else timeout
    deadline = time.monotonic() + timeout
    while True:
        try:
            meta: ClusterMetadata = consumer.list_topics(
                timeout=min(1.0, max(0.1, deadline - time.monotonic()))
            )
            return meta
        except KafkaException as exc:
            consumer.poll(0)  # serves error_cb
            down = any(e.code() == KafkaError._ALL_BROKERS_DOWN for e in errors)
            if down or time.monotonic() >= deadline:
                why = next((e for e in errors if e.code() != KafkaError._ALL_BROKERS_DOWN), exc)
                limits = f"connect {kafka.timeouts.connect_s:g}s, request {timeout:g}s"
                # the servers the client used: a `bootstrap.servers` property wins
                raise EndpointError(
                    f"Kafka at {kafka.servers} could not be reached ({limits}): {why} -- check "
                    "that the brokers run there and are reachable from this host "
                    "(kafka.bootstrap_servers, or bootstrap.servers and the security settings "
                    "under kafka.properties); a slow network may need larger timeouts in the "
                    "pipeline file"
                ) from exc


def list_topics(kafka: KafkaConfig, timeout: float | None = None) -> list[str]:
    """Every topic the broker has."""
    with topic_metadata(kafka, timeout) as (_, meta):
        return sorted(meta.topics)


def discover(pipeline: PipelineConfig, topics: Iterable[str] | None = None) -> PipelineConfig:
    """The pipeline with the tables its patterns match among the captured topics (the
    broker's, unless `topics` are given). A pipeline without patterns is returned as is."""
    if not pipeline.patterns:
        return pipeline
    return pipeline.with_topics(list_topics(pipeline.kafka) if topics is None else topics)


Raw = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def raw_records(
    kafka: KafkaConfig, wanted: Iterable[tuple[str, int, int]]
) -> dict[tuple[str, int, int], Raw]:
    """The records at (topic, partition, offset) exactly as Kafka holds them: key, value
    and headers as bytes. A partition is read once, from its first wanted offset to its
    last; a record Kafka no longer holds is an EndpointError naming it."""
    from confluent_kafka import Consumer, TopicPartition

    timeout = kafka.timeouts.request_s
    by_partition: dict[tuple[str, int], set[int]] = {}
    for topic, partition, offset in wanted:
        by_partition.setdefault((topic, partition), set()).add(offset)
    consumer = Consumer(
        {
            **kafka.client_config(),
            "group.id": "cdclake-dead-letters",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    out: dict[tuple[str, int, int], Raw] = {}
    try:
        for (topic, partition), offsets in sorted(by_partition.items()):
            consumer.assign([TopicPartition(topic, partition, min(offsets))])
            last, idle = max(offsets), time.monotonic() + timeout
            while time.monotonic() < idle:
                msg = consumer.poll(1.0)
                if msg is None:
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() == -191:  # end of partition
                        break
                    raise EndpointError(
                        f"Kafka at {kafka.servers}: reading {topic}[{partition}]"
                        f"@{min(offsets)}: {error}"
                    )
                idle = time.monotonic() + timeout
                at = cast(int, msg.offset())  # a record's, not an event's: set
                if at in offsets:
                    headers = list(cast("list[tuple[str, bytes | None]]", msg.headers() or []))
                    out[(topic, partition, at)] = (msg.key(), msg.value(), headers)
                if at >= last:
                    break
            missing = sorted(o for o in offsets if (topic, partition, o) not in out)
            if missing:
                raise EndpointError(
                    f"Kafka at {kafka.servers}: {topic} partition {partition} offset "
                    f"{missing[0]}: the record to set aside could not be read again within "
                    f"{timeout:g}s (timeouts.request_s)"
                )
    finally:
        consumer.close()
    return out
