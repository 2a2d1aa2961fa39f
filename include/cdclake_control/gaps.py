"""Retention gaps that heal themselves (`on_gap: resnapshot`).

A plan that finds a table's committed offsets below its topic's log start (records that
retention deleted before they were loaded) sends an incremental snapshot of the table
through the signal code and loads on from the log start. The snapshot reads every row the
source holds again, and every change after it is sent comes as a new record; so once the
snapshot completed and a batch read past its last record, a row still last written by a
record below the topic's end offsets of when it was sent (`Heal.marks`) is a row the
source deleted during the gap. That batch removes them in the commit that carries its
offsets (`Heal.sweep`, `cdclake.iceberg.write`). Until then every commit of the table
carries the heal (`SUMMARY_HEAL`), so each plan picks it up again; the commit that sweeps
says what it did (`SUMMARY_HEALED`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from enum import StrEnum
from typing import cast

from cdclake.config import OnGap, PipelineConfig, TableConfig
from cdclake.exceptions import ConfigError
from cdclake.offsets import (
    SUMMARY_HEAL,
    SUMMARY_HEALED,
    Heal,
    OffsetRange,
    TopicPartition,
    Watermarks,
    utc_text,
)

from cdclake_control.catalog import TableState
from cdclake_control.signals import (
    Action,
    SnapshotProgress,
    SnapshotRequest,
    notification_consumer,
    notification_offsets,
    notification_payload,
    submit,
)

log = logging.getLogger(__name__)
# the snapshot's last records reach Kafka before its COMPLETED notification, which Kafka
# Connect sends after them; a sweep waits this long after it all the same
COMPLETED_MARGIN_MS = 10_000


class Snapshot(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"  # and older than COMPLETED_MARGIN_MS
    ABORTED = "aborted"


def pending_heals(
    pipeline: PipelineConfig, states: Mapping[str, TableState]
) -> dict[str, tuple[Heal, Snapshot]]:
    """The heals the tables' last commits carry, each with where its snapshot stands.
    Read before the topics' end offsets, so a batch planned after reads every record of a
    completed snapshot."""
    out = {}
    for name, state in states.items():
        text = state.offsets_summary.get(SUMMARY_HEAL)
        if text:
            heal = Heal.from_dict(json.loads(text))
            out[name] = (heal, snapshot_state(pipeline, heal))
    return out


def heal_gaps(
    pipeline: PipelineConfig,
    states: Mapping[str, TableState],
    marks: Mapping[TopicPartition, Watermarks],
    pending: Mapping[str, tuple[Heal, Snapshot]],
    dsn: str | None,
) -> tuple[dict[TopicPartition, int], dict[str, Heal]]:
    """The offsets to plan from (a gap's partitions at their log start, with `on_gap:
    resnapshot`; else as committed, which the plan refuses) and the batch's heals: one
    started for each gap (or snapshot that aborted), and those pending."""
    committed: dict[TopicPartition, int] = {}
    heals: dict[str, Heal] = {}
    for name, state in states.items():
        offsets = dict(state.offsets)
        lost = tuple(
            sorted(
                (p, start, marks[(t, p)].low)
                for (t, p), start in offsets.items()
                if (t, p) in marks and start < marks[(t, p)].low
            )
        )
        heal, snapshot = pending.get(name, (None, None))
        if pipeline.on_gap is OnGap.RESNAPSHOT and (lost or snapshot is Snapshot.ABORTED):
            table = pipeline.table_named(name)
            assert table is not None  # `states` holds the pipeline's tables
            if heal is not None:
                lost = lost or heal.lost
                log.warning("%s: snapshot %s aborted; sending another", name, heal.signal_id)
            heals[name] = start_heal(pipeline, table, lost, marks, dsn)
            offsets.update({(pipeline.topic_for(table), p): low for p, _, low in lost})
        elif heal is not None:
            heals[name] = replace(heal, sweep=snapshot is Snapshot.COMPLETED)
        committed.update(offsets)
    return committed, heals


def start_heal(
    pipeline: PipelineConfig,
    table: TableConfig,
    lost: tuple[tuple[int, int, int], ...],
    marks: Mapping[TopicPartition, Watermarks],
    dsn: str | None,
) -> Heal:
    """Send the incremental snapshot of `table` that heals the gap `lost`."""
    if dsn is None:
        raise ConfigError(
            f"{pipeline.path}: on_gap: resnapshot sends an incremental snapshot of "
            f"{table.source}, which needs the source database: set source.conn_id's Airflow "
            "connection, or source.dsn for the CLI"
        )
    channel = "kafka" if pipeline.source.signal_topic else "source"
    request = SnapshotRequest(Action.EXECUTE, (table.source,))
    sent = submit(pipeline, dsn, request, channel, origin="heal")
    topic = pipeline.topic_for(table)
    heal = Heal(
        signal_id=sent["signal_id"],
        since_ms=int(time.time() * 1000),
        lost=lost,
        marks={p: m.high for (t, p), m in marks.items() if t == topic},
        notes_from={int(p): o for p, o in sent["notification_offsets"].items()},
    )
    for p, first, low in lost:
        log.warning(
            "%s: retention deleted %s[%d] offsets %d..%d before they were loaded; loading on "
            "from %d, and incremental snapshot %s re-reads the table",
            table.source,
            topic,
            p,
            first,
            low - 1,
            low,
            heal.signal_id,
        )
    return heal


def snapshot_state(pipeline: PipelineConfig, heal: Heal, now_ms: int | None = None) -> Snapshot:
    """Where `heal`'s snapshot stands, from Debezium's notifications up to the end of
    their topic (the read bounded by `timeouts.request_s`)."""
    kafka, topic = pipeline.kafka, pipeline.notification_topic
    ends = notification_offsets(kafka, topic)
    progress = SnapshotProgress(heal.signal_id)
    consumer = notification_consumer(kafka, heal.signal_id, topic, heal.notes_from)
    deadline = time.monotonic() + kafka.timeouts.request_s
    done_ms = None
    try:
        read = dict(heal.notes_from)
        while any(read.get(p, 0) < end for p, end in ends.items()):
            if time.monotonic() > deadline:
                log.warning("%s: notifications not read to their end in time", topic)
                break
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            read[cast(int, msg.partition())] = cast(int, msg.offset()) + 1
            value = msg.value()
            if value and progress.feed(notification_payload(value)) and progress.finished:
                done_ms = msg.timestamp()[1]
    finally:
        consumer.close()
    if progress.status == "ABORTED":
        return Snapshot.ABORTED
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if done_ms is not None and done_ms <= now_ms - COMPLETED_MARGIN_MS:
        return Snapshot.COMPLETED
    return Snapshot.RUNNING


def with_heals(
    pipeline: PipelineConfig,
    heals: Mapping[str, Heal],
    pending: Mapping[str, tuple[Heal, Snapshot]],
    ranges: tuple[OffsetRange, ...],
    marks: Mapping[TopicPartition, Watermarks],
    committed: Mapping[TopicPartition, int],
) -> tuple[dict[str, Heal], tuple[OffsetRange, ...]]:
    """A heal sweeps in this batch only when the batch reads its topic to the end. A table
    whose heal starts or sweeps gets empty ranges when it has nothing to read, so the
    batch commits it all the same."""
    out, extra = {}, []
    ends = {tp: m.high for tp, m in marks.items()}
    for name, heal in heals.items():
        table = pipeline.table_named(name)
        topic = pipeline.topic_for(table) if table is not None else ""
        read = {(r.topic, r.partition): r.end for r in ranges if r.topic == topic}
        to_end = all(
            read.get(tp, committed.get(tp, 0)) >= e for tp, e in ends.items() if tp[0] == topic
        )
        out[name] = replace(heal, sweep=heal.sweep and to_end)
        started = name not in pending or pending[name][0].signal_id != heal.signal_id
        if (started or out[name].sweep) and not read:
            extra += [OffsetRange(t, p, o, o) for (t, p), o in committed.items() if t == topic]
    return out, tuple(sorted(ranges + tuple(extra)))


def heal_status(summary: Mapping[str, str], committed_at_ms: int | None) -> str | None:
    """What a table's last commit (its `summary`, written at `committed_at_ms`) says of a
    retention gap: being healed, or healed by that commit; None: nothing."""
    text = summary.get(SUMMARY_HEAL) or summary.get(SUMMARY_HEALED)
    if not text:
        return None
    heal = Heal.from_dict(json.loads(text))
    if SUMMARY_HEAL in summary:
        return f"healing since {utc_text(heal.since_ms)} (snapshot {heal.signal_id})"
    return f"healed at {utc_text(committed_at_ms or heal.since_ms)}"
