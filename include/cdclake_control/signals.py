"""Debezium signals (execute/stop/pause/resume an incremental snapshot) and following
their progress on the notification topic.

The signal goes into the signal table with bound parameters only. Debezium 3.x silently
ignores the old singular `additional-condition`, so only `additional-conditions` is ever
written. Debezium reports invalid signals only in its own log, so requests are validated
here before anything is written, whichever channel (signal table or Kafka topic) sends
them: filters can only read (cdclake_control.snapshot_filter) and fit where they are stored.
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
from typing import TYPE_CHECKING, Any, cast

from cdclake.config import KafkaConfig, PipelineConfig, TimeoutsConfig
from cdclake.exceptions import CdclakeError, first_line

from cdclake_control.snapshot_filter import FilterError, check_in_source, filter_sql, parse_filter
from cdclake_control.source import connect_source

if TYPE_CHECKING:
    import psycopg
    from confluent_kafka import Consumer, KafkaError, Message

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")
# every wait on the source database is bounded
SOURCE_STATEMENT_TIMEOUT_MS = 10_000


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
    if request.action in (Action.PAUSE, Action.RESUME) and request.tables:
        raise SignalError(f"{request.action.value} applies to the running snapshot; give no tables")
    if request.action is not Action.EXECUTE:
        if request.type is SnapshotType.BLOCKING:
            raise SignalError(f"{request.action.value} applies to incremental snapshots only")
        if request.filters or request.surrogate_key:
            raise SignalError("filters and a surrogate key apply to execute-snapshot only")
    for table in request.tables:
        parts = table.split(".")
        if len(parts) != 2 or not all(_NAME.match(p) for p in parts):
            raise SignalError(f"table {table!r} must be '<schema>.<table>' with plain names")
        if table not in captured:
            raise SignalError(f"table {table!r} is not captured by this pipeline")
    for table, condition in request.filters.items():
        if table not in request.tables:
            raise SignalError(f"filter given for {table!r}, which is not being snapshotted")
        try:
            parse_filter(table, condition)
        except FilterError as exc:
            raise SignalError(str(exc)) from None
    if request.surrogate_key is not None and not _NAME.match(request.surrogate_key):
        raise SignalError(f"surrogate key {request.surrogate_key!r} is not a column name")


def signal_data(request: SnapshotRequest) -> dict[str, Any]:
    """The `data` document of the signal (Debezium 3.x field names)."""
    if request.action in (Action.PAUSE, Action.RESUME):
        return {}
    data: dict[str, Any] = {"data-collections": [re.escape(t) for t in request.tables]}
    data["type"] = request.type.value
    if request.action is Action.EXECUTE:
        if request.filters:
            data["additional-conditions"] = [
                {"data-collection": t, "filter": filter_sql(f)} for t, f in request.filters.items()
            ]
        if request.surrogate_key:
            data["surrogate-key"] = request.surrogate_key
    return data


SIGNAL_ID_CHARS = (42, 64)  # Debezium writes ids of 42 into the signal table; ours fit 64


def new_signal_id(run_id: str | None = None, max_chars: int = SIGNAL_ID_CHARS[1]) -> str:
    """An id traceable to what sent it (e.g. the DAG run), unique per attempt (at least 16
    random hex digits), 42 to `max_chars` (at most 64) characters."""
    low, high = SIGNAL_ID_CHARS
    max_chars = max(low, min(high, max_chars))
    room = max_chars - len("cdclake--") - 16
    origin = re.sub(r"[^A-Za-z0-9_.-]+", "-", run_id or "cli").strip("-")[:room].strip("-")
    return f"cdclake-{origin}-{uuid.uuid4().hex}"[:max_chars].ljust(low, "0")


def parse_request(
    action: str,
    tables: Sequence[str] | None = (),
    type: str | None = "incremental",
    filters: Mapping[str, str] | str | None = None,
    surrogate_key: str | None = None,
) -> SnapshotRequest:
    """A request from form or command-line values, with errors naming the bad value.
    `filters` may be the JSON text of the object (the form's Filters box)."""
    tables = () if tables is None else tables
    type = type or "incremental"
    if isinstance(filters, str):
        filters = _filters_from_json(filters)
    names = {
        "execute": Action.EXECUTE,
        "stop": Action.STOP,
        "pause": Action.PAUSE,
        "resume": Action.RESUME,
    }
    key = str(action).strip().lower().removesuffix("-snapshot")
    if key not in names:
        raise SignalError(f"action {action!r} is not one of {sorted(names)}")
    try:
        kind = SnapshotType(str(type).strip().lower())
    except ValueError:
        raise SignalError(
            f"type {type!r} is not one of {[t.value for t in SnapshotType]}"
        ) from None
    if filters is not None and not isinstance(filters, Mapping):
        raise SignalError("filters must be an object of table -> SQL condition")
    for t, f in (filters or {}).items():
        if not isinstance(f, str):
            raise SignalError(f"filter for {t!r} must be a string, got {f!r}")
    if isinstance(tables, str) or not all(isinstance(t, str) for t in tables):
        raise SignalError(f"tables must be a list of 'schema.table' names, got {tables!r}")
    return SnapshotRequest(
        action=names[key],
        tables=tuple(dict.fromkeys(t.strip() for t in tables)),
        type=kind,
        filters=dict(filters or {}),
        surrogate_key=(surrogate_key or "").strip() or None,
    )


def _filters_from_json(text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SignalError(
            f"filters: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            'give an object of table -> SQL condition, e.g. {"inventory.orders": "quantity > 1"}'
        ) from None
    if not isinstance(value, dict):
        raise SignalError("filters must be an object of table -> SQL condition")
    return value


def check_source(
    dsn: str,
    signal_table: str,
    request: SnapshotRequest,
    channel: str = "source",
    timeouts: TimeoutsConfig | None = None,
    filter_max_seconds: float = 600.0,
) -> int:
    """Validate against the source database, writing nothing, every wait bounded: the
    signal table and every table exist, the surrogate key is a column of each, each filter
    calls only functions pg_proc marks immutable and is a valid condition on its table
    that costs the source at most `filter_max_seconds` (run on a sample in a read-only
    transaction, after the function check), and, for
    the source channel, the signal fits the signal table's `data` column. Returns how many
    characters a signal id may have."""
    import psycopg

    conn = connect_source(dsn, timeouts or TimeoutsConfig(), autocommit=False)
    with conn:
        conn.execute("SET TRANSACTION READ ONLY")
        conn.execute(f"SET LOCAL statement_timeout = {int(SOURCE_STATEMENT_TIMEOUT_MS)}")
        try:
            _check_tables(conn, signal_table, request)
            _check_filters(conn, request, filter_max_seconds)
            if channel == "source":
                return _check_signal_fits(conn, signal_table, request)
            return SIGNAL_ID_CHARS[1]
        except psycopg.errors.QueryCanceled:
            raise SignalError(
                f"source database did not answer within {SOURCE_STATEMENT_TIMEOUT_MS} ms"
            ) from None
        finally:
            conn.rollback()


def _check_tables(
    conn: psycopg.Connection[Any], signal_table: str, request: SnapshotRequest
) -> None:
    for table in (signal_table, *request.tables):
        schema, name = table.split(".", 1)
        found = conn.execute(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = %s",
            (schema, name),
        ).fetchone()
        if not found:
            what = "signal table" if table == signal_table else "table"
            raise SignalError(f"{what} {table!r} does not exist in the source database")
    if request.surrogate_key:
        for table in request.tables:
            schema, name = table.split(".", 1)
            found = conn.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_schema = %s "
                "AND table_name = %s AND column_name = %s",
                (schema, name, request.surrogate_key),
            ).fetchone()
            if not found:
                raise SignalError(
                    f"surrogate key {request.surrogate_key!r} is not a column of {table!r}"
                )


def _check_filters(
    conn: psycopg.Connection[Any], request: SnapshotRequest, max_seconds: float
) -> None:
    for table, condition in request.filters.items():
        try:
            seconds = check_in_source(conn, table, condition, max_seconds)
        except FilterError as exc:
            raise SignalError(str(exc)) from None
        log.info("filter for %s: about %.1f s of the source database's time", table, seconds)


def _check_signal_fits(
    conn: psycopg.Connection[Any], signal_table: str, request: SnapshotRequest
) -> int:
    """The signal table's `data` column is often varchar(2048) and its `id` varchar(42)
    (Debezium's examples): a longer signal would fail the INSERT. The id's length."""
    schema, name = signal_table.split(".", 1)
    limits = dict(
        conn.execute(
            "SELECT column_name, character_maximum_length FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = %s AND column_name IN ('id', 'data')",
            (schema, name),
        ).fetchall()
    )
    id_chars = limits.get("id") or SIGNAL_ID_CHARS[1]
    if id_chars < SIGNAL_ID_CHARS[0]:
        raise SignalError(
            f"{signal_table}.id holds {id_chars} characters; Debezium writes ids of "
            f"{SIGNAL_ID_CHARS[0]} (ALTER TABLE {signal_table} ALTER COLUMN id TYPE varchar(64))"
        )
    limit = limits.get("data")
    size = len(json.dumps(signal_data(request)))
    if limit is not None and size > limit:
        raise SignalError(
            f"the signal's data is {size:,} characters, more than the {limit:,} that "
            f"{signal_table}.data holds (varchar({limit})): shorten the filters, snapshot "
            f"fewer tables at once, or widen the column (ALTER TABLE {signal_table} ALTER "
            "COLUMN data TYPE text)"
        )
    return id_chars


def send_to_signal_table(
    dsn: str,
    signal_table: str,
    signal_id: str,
    request: SnapshotRequest,
    timeouts: TimeoutsConfig | None = None,
) -> None:
    import psycopg
    from psycopg import sql

    schema, table = signal_table.split(".", 1)
    statement = sql.SQL("INSERT INTO {}.{} (id, type, data) VALUES (%s, %s, %s)").format(
        sql.Identifier(schema), sql.Identifier(table)
    )
    data = json.dumps(signal_data(request))
    try:
        with connect_source(dsn, timeouts or TimeoutsConfig(), autocommit=True) as conn:
            conn.execute(statement, (signal_id, request.action.value, data))
    except psycopg.Error as exc:
        raise SignalError(
            f"signal {signal_id} could not be written to {signal_table}: {first_line(exc)}"
        ) from None
    log.info("signal %s sent: %s %s", signal_id, request.action.value, list(request.tables))


def send_to_kafka(
    kafka: KafkaConfig, topic: str, topic_prefix: str, signal_id: str, request: SnapshotRequest
) -> None:
    """The Kafka signal channel: key = the connector's topic.prefix, partition 0."""
    from confluent_kafka import Producer

    producer = Producer(kafka.client_config())
    value = {"id": signal_id, "type": request.action.value, "data": signal_data(request)}
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err:
            errors.append(err)

    producer.produce(
        topic,
        key=topic_prefix.encode(),
        value=json.dumps(value).encode(),
        partition=0,
        on_delivery=delivered,
    )
    if producer.flush(30) or errors:
        raise SignalError(f"signal {signal_id} could not be sent to {topic}: {errors or 'timeout'}")
    log.info(
        "signal %s sent to %s: %s %s", signal_id, topic, request.action.value, list(request.tables)
    )


@dataclass
class SnapshotProgress:
    """What Debezium's notifications said about one snapshot so far.

    Incremental snapshots carry the signal id in every notification. Blocking snapshots
    are reported like the initial snapshot ("Initial Snapshot" notifications with ids of
    their own), so they are followed from the notification offset taken before sending.
    """

    signal_id: str
    blocking: bool = False
    status: str = "PENDING"  # STARTED, COMPLETED, ABORTED ...
    chunks: int = 0
    rows_scanned: dict[str, int] = field(default_factory=dict)
    tables: dict[str, dict[str, str]] = field(default_factory=dict)  # per table scan result
    current: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in ("COMPLETED", "ABORTED")

    def feed(self, note: Mapping[str, Any]) -> str | None:
        """Take one notification; a line to log when it is about this snapshot."""
        mine = (
            note.get("aggregate_type") == "Initial Snapshot"
            if self.blocking
            else note.get("id") == self.signal_id
        )
        if not mine or self.finished:
            return None
        kind = str(note.get("type", ""))
        extra = note.get("additional_data") or {}
        if kind == "IN_PROGRESS":
            self.chunks += 1
            self.current = extra.get("current_collection_in_progress") or self.current
            key = extra.get("last_processed_key", "?")
            return f"chunk {self.chunks}: {self.current or '?'} up to key {key}"
        if kind == "TABLE_SCAN_COMPLETED":
            name = extra.get("data_collection") or extra.get("scanned_collection") or "?"
            self.tables[name] = dict(extra)
            rows = extra.get("total_rows_scanned")
            if rows is not None and str(rows).isdigit():
                self.rows_scanned[name] = int(rows)
            return f"{name}: scan {_scan_status(extra)}, {rows if rows is not None else '?'} rows"
        if kind in ("STARTED", "COMPLETED", "ABORTED", "PAUSED", "RESUMED", "SKIPPED"):
            self.status = "ABORTED" if kind == "SKIPPED" else kind
            return f"snapshot {kind.lower()}"
        return None

    def check(self) -> SnapshotProgress:
        """Raise SignalError when the snapshot aborted or a table's scan did not succeed."""
        failed = {t: r for t, r in self.tables.items() if _scan_status(r) != "SUCCEEDED"}
        if self.status == "ABORTED" or failed:
            reasons = "; ".join(f"{t}: {_scan_status(r)}" for t, r in failed.items())
            reasons = reasons or "aborted by Debezium"
            raise SignalError(f"snapshot {self.signal_id} {self.status.lower()}: {reasons}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "signal_id": self.signal_id,
            "status": self.status,
            "chunks": self.chunks,
            "rows_scanned": self.rows_scanned,
            "tables": self.tables,
        }


def notification_consumer(
    kafka: KafkaConfig, signal_id: str, topic: str, start: Mapping[int, int] | None
) -> Consumer:
    """A consumer on the notification topic from `start` (per partition; default 0)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            **kafka.client_config(),
            "group.id": f"cdclake-follow-{signal_id}",
            "enable.auto.commit": False,
        }
    )
    meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
    parts = sorted(meta.partitions) if meta and not meta.error and meta.partitions else [0]
    start = start or {}
    consumer.assign([TopicPartition(topic, p, int(start.get(p, 0))) for p in parts])
    return consumer


def notification_offsets(kafka: KafkaConfig, topic: str) -> dict[int, int]:
    """End offsets of the notification topic: where to follow a signal sent now from."""
    from cdclake_control.watermarks import fetch_watermarks

    return {p: m.high for (_, p), m in fetch_watermarks(kafka, [topic]).items()}


def poll_notification(consumer: Consumer, timeout: float = 1.0) -> dict[str, Any] | None:
    msg = consumer.poll(timeout)
    if msg is None or msg.error() or msg.value() is None:
        return None
    try:
        return notification_payload(cast(bytes, msg.value()))  # not None: checked above
    except ValueError:
        log.warning("notification at offset %s is not JSON; ignored", msg.offset())
        return None


def follow_snapshot(
    kafka: KafkaConfig,
    topic: str,
    signal_id: str,
    timeout_s: float = 600.0,
    start: Mapping[int, int] | None = None,
    blocking: bool = False,
) -> SnapshotProgress:
    """Read Debezium's notifications until the snapshot completes or aborts, logging
    progress; a table whose scan status is not SUCCEEDED fails with Debezium's reason."""
    progress = SnapshotProgress(signal_id, blocking=blocking)
    consumer = notification_consumer(kafka, signal_id, topic, start)
    deadline = time.monotonic() + timeout_s
    try:
        while not progress.finished:
            if time.monotonic() > deadline:
                raise SignalError(f"snapshot {signal_id} did not finish within {timeout_s:.0f}s")
            note = poll_notification(consumer)
            line = progress.feed(note) if note else None
            if line:
                log.info("snapshot %s: %s", signal_id, line)
    finally:
        consumer.close()
    return progress.check()


def _scan_status(result: Mapping[str, str]) -> str:
    return result.get("scan_status") or result.get("status") or "SUCCEEDED"


def notification_payload(value: bytes) -> dict[str, Any]:
    doc = json.loads(value)
    return doc.get("payload", doc) if isinstance(doc, dict) else {}


def submit(
    pipeline: PipelineConfig,
    dsn: str,
    request: SnapshotRequest,
    channel: str = "source",
    origin: str | None = None,
) -> dict[str, Any]:
    """Validate a request against the pipeline and the source database, then send it.

    Nothing is written unless every check passes. Returns what following it needs: the
    signal id and the notification topic's offsets taken just before sending.
    """
    captured = [t.source for t in pipeline.tables]  # and what the patterns match
    captured += [n for n in request.tables if pipeline.table_named(n) is not None]
    validate(request, captured)
    if channel not in ("source", "kafka"):
        raise SignalError(f"channel {channel!r} is not one of ['source', 'kafka']")
    if channel == "kafka" and not pipeline.source.signal_topic:
        raise SignalError(
            f"{pipeline.path}: source.signal_topic is not set, so the kafka channel is unavailable"
        )
    id_chars = check_source(
        dsn,
        pipeline.source.signal_table,
        request,
        channel,
        pipeline.timeouts,
        pipeline.source.filter_max_seconds,
    )
    signal_id = new_signal_id(origin, id_chars)
    start = notification_offsets(pipeline.kafka, pipeline.notification_topic)
    if channel == "kafka":
        send_to_kafka(
            pipeline.kafka,
            cast(str, pipeline.source.signal_topic),  # set: checked above
            pipeline.topic_prefix,
            signal_id,
            request,
        )
    else:
        send_to_signal_table(
            dsn, pipeline.source.signal_table, signal_id, request, pipeline.timeouts
        )
    return {
        "pipeline": pipeline.name,
        "pipeline_path": str(pipeline.path),
        "signal_id": signal_id,
        "action": request.action.value,
        "tables": list(request.tables),
        "follow": request.action is Action.EXECUTE,
        "blocking": request.type is SnapshotType.BLOCKING,
        "notification_offsets": {str(p): o for p, o in start.items()},
    }
