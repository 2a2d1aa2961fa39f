"""Debezium signals (execute/stop/pause/resume an incremental snapshot) and following
their progress on the notification topic.

The signal goes into the signal table with bound parameters only. Debezium 3.x silently
ignores the old singular `additional-condition`, so only `additional-conditions` is ever
written. Debezium reports invalid signals only in its own log, so requests are validated
here before anything is written.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from cdclake.config import KafkaConfig
from cdclake.exceptions import CdclakeError

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")
_FORBIDDEN_IN_FILTER = (";", "--", "/*", "*/")


class SignalError(CdclakeError):
    """A snapshot request that must not be sent, or a snapshot that did not complete."""


class Action(StrEnum):
    EXECUTE = "execute-snapshot"
    STOP = "stop-snapshot"
    PAUSE = "pause-snapshot"
    RESUME = "resume-snapshot"


class SnapshotType(StrEnum):
    INCREMENTAL = "incremental"
    BLOCKING = "blocking"


@dataclass(frozen=True)
class SnapshotRequest:
    action: Action
    tables: tuple[str, ...] = ()  # "<schema>.<table>"
    type: SnapshotType = SnapshotType.INCREMENTAL
    filters: Mapping[str, str] = field(default_factory=dict)  # table -> SQL condition
    surrogate_key: str | None = None


def validate(request: SnapshotRequest, captured: Sequence[str]) -> None:
    """Refuse anything Debezium would ignore or misread, naming what is wrong."""
    if request.action is Action.EXECUTE and not request.tables:
        raise SignalError("execute-snapshot needs at least one table")
    for table in request.tables:
        parts = table.split(".")
        if len(parts) != 2 or not all(_NAME.match(p) for p in parts):
            raise SignalError(f"table {table!r} must be '<schema>.<table>' with plain names")
        if table not in captured:
            raise SignalError(f"table {table!r} is not captured by this pipeline")
    for table, condition in request.filters.items():
        if table not in request.tables:
            raise SignalError(f"filter given for {table!r}, which is not being snapshotted")
        if not condition.strip():
            raise SignalError(f"filter for {table!r} is empty")
        if any(bad in condition for bad in _FORBIDDEN_IN_FILTER):
            raise SignalError(
                f"filter for {table!r} may not contain statement separators or comments"
            )
    if request.surrogate_key is not None and not _NAME.match(request.surrogate_key):
        raise SignalError(f"surrogate key {request.surrogate_key!r} is not a column name")


def signal_data(request: SnapshotRequest) -> dict:
    """The `data` document of the signal (Debezium 3.x field names)."""
    if request.action in (Action.PAUSE, Action.RESUME):
        return {}
    data: dict = {"data-collections": [re.escape(t) for t in request.tables]}
    data["type"] = request.type.value
    if request.action is Action.EXECUTE:
        if request.filters:
            data["additional-conditions"] = [
                {"data-collection": t, "filter": f} for t, f in request.filters.items()
            ]
        if request.surrogate_key:
            data["surrogate-key"] = request.surrogate_key
    return data


def new_signal_id(run_id: str | None = None) -> str:
    """Ids are traceable to what sent them and long enough for Debezium (42+ chars)."""
    suffix = uuid.uuid4().hex
    base = f"cdclake-{run_id}-{suffix}" if run_id else f"cdclake-{suffix}"
    return base[:64].ljust(42, "0")


def send_to_signal_table(dsn: str, signal_table: str, signal_id: str, request: SnapshotRequest):
    import psycopg
    from psycopg import sql

    schema, table = signal_table.split(".", 1)
    statement = sql.SQL("INSERT INTO {}.{} (id, type, data) VALUES (%s, %s, %s)").format(
        sql.Identifier(schema), sql.Identifier(table)
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement, (signal_id, request.action.value, json.dumps(signal_data(request))))
    log.info("signal %s sent: %s %s", signal_id, request.action.value, list(request.tables))


@dataclass
class SnapshotProgress:
    signal_id: str
    status: str = "PENDING"  # STARTED, COMPLETED, ABORTED ...
    chunks: int = 0
    tables: dict[str, dict[str, str]] = field(default_factory=dict)  # per table scan result


def follow_snapshot(
    kafka: KafkaConfig, topic: str, signal_id: str, timeout_s: float = 600.0
) -> SnapshotProgress:
    """Read Debezium's notifications until the snapshot completes or aborts.

    Incremental-snapshot notifications carry the signal id as their `id`. A table whose
    scan status is not SUCCEEDED fails, with the reason Debezium gives.
    """
    from confluent_kafka import Consumer, TopicPartition

    progress = SnapshotProgress(signal_id)
    consumer = Consumer(
        {
            **kafka.client_config(),
            "group.id": f"cdclake-follow-{signal_id}",
            "enable.auto.commit": False,
        }  # fmt: skip
    )
    deadline = time.monotonic() + timeout_s
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        parts = sorted(meta.partitions) if meta and not meta.error else [0]
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error() or msg.value() is None:
                continue
            note = _payload(msg.value())
            if note.get("id") != signal_id:
                continue
            kind = note.get("type", "")
            extra = note.get("additional_data") or {}
            if kind == "IN_PROGRESS":
                progress.chunks += 1
            elif kind == "TABLE_SCAN_COMPLETED":
                name = extra.get("data_collection", "?")
                progress.tables[name] = dict(extra)
                log.info("snapshot %s: %s scanned (%s)", signal_id, name, extra)
            if kind in ("STARTED", "COMPLETED", "ABORTED", "PAUSED", "RESUMED"):
                progress.status = kind
            if kind in ("COMPLETED", "ABORTED"):
                break
        else:
            raise SignalError(f"snapshot {signal_id} did not finish within {timeout_s:.0f}s")
    finally:
        consumer.close()
    failed = {t: r for t, r in progress.tables.items() if _scan_status(r) != "SUCCEEDED"}
    if progress.status == "ABORTED" or failed:
        raise SignalError(f"snapshot {signal_id} {progress.status.lower()}: {failed or 'aborted'}")
    return progress


def _scan_status(result: Mapping[str, str]) -> str:
    return result.get("scan_status") or result.get("status") or "SUCCEEDED"


def _payload(value: bytes) -> dict:
    doc = json.loads(value)
    return doc.get("payload", doc) if isinstance(doc, dict) else {}
