"""Batches that end on one source transaction for every table (`consistency:
transaction`).

Debezium writes each transaction's END record to the transaction topic after its
changes, and a partition holds its changes in commit order. The plan picks the last
transaction whose END is at least `SETTLED_MS` old and whose changes fit in the batch's
cap, and cuts every partition of the pipeline just before its first change of a later
transaction (found by bisecting offsets; records outside any transaction, such as
snapshot reads and tombstones, go with what precedes them). After such a batch the load
tags every table at that cut (`cdclake.iceberg.tags`), so a query of several tables at
the tag sees the source as of one transaction.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

from cdclake.config import PipelineConfig
from cdclake.debezium.avro import envelope
from cdclake.exceptions import EndpointError
from cdclake.offsets import SUMMARY_CUT, Cut, OffsetRange, TopicPartition, Watermarks

from cdclake_control.catalog import TableState
from cdclake_control.watermarks import fetch_watermarks

if TYPE_CHECKING:
    from confluent_kafka import Consumer

log = logging.getLogger(__name__)
# Kafka Connect sends a transaction's changes before its END record; an END this old
# has them all in Kafka
SETTLED_MS = 10_000
POLL_S = 1.0


def consistent_ranges(
    pipeline: PipelineConfig,
    states: Mapping[str, TableState],
    committed: Mapping[TopicPartition, int],
    ranges: tuple[OffsetRange, ...],
    marks: Mapping[TopicPartition, Watermarks],
) -> tuple[tuple[OffsetRange, ...], Cut | None]:
    """The batch (`ranges`, as the cap cut it from the `committed` offsets) cut back to
    one transaction in every partition, and that transaction; `((), None)` when no
    transaction is complete yet."""
    if not ranges:
        return (), None
    started = time.monotonic()
    # the cut each table last committed (None: none yet)
    done = {
        name: Cut.from_json(text) if (text := s.offsets_summary.get(SUMMARY_CUT)) else None
        for name, s in states.items()
    }
    with _Prober(pipeline) as prober:
        ends = transaction_ends(
            pipeline, prober.consumer, _read_from(pipeline, done, committed, marks)
        )
        if not ends:
            return (), None
        ranges, cut = _cut(prober, ends, done, committed, ranges, marks)
    log.info(
        "%s in %.2fs (%d records read)", cut.describe(), time.monotonic() - started, prober.reads
    )
    return ranges, cut


def _cut(
    prober: _Prober,
    ends: list[tuple[int, int | None, int, int]],
    done: Mapping[str, Cut | None],
    committed: Mapping[TopicPartition, int],
    ranges: tuple[OffsetRange, ...],
    marks: Mapping[TopicPartition, Watermarks],
) -> tuple[tuple[OffsetRange, ...], Cut]:
    """The last of `ends` the batch takes whole, and each partition cut after it."""
    # every partition with records to read, where the cap ends its range (at its start
    # when the cap left it out)
    starts = {tp: committed.get(tp, m.low) for tp, m in marks.items()}
    capped = {tp: s for tp, s in starts.items() if s < marks[tp].high}
    capped.update({(r.topic, r.partition): r.end for r in ranges})
    order: dict[int, int] = {}
    for i, (txid, *_) in enumerate(ends):  # a re-sent transaction keeps its first place
        order.setdefault(txid, i)
    prober.order, prober.past = order, len(ends)
    # no table goes back: a batch that failed half-way left some tables at a later cut
    floor = max([order[c.txid] for c in done.values() if c and c.txid in order] + [0])
    beyond = [prober.first_order(t, p, end, marks)[0] for (t, p), end in capped.items()]
    # a transaction bigger than the cap is loaded whole
    last = max(floor, min([k - 1 for k in beyond] + [len(ends) - 1]))
    txid, lsn, ts_ms, offset = ends[last]
    cut = []
    for (t, p), start in sorted(starts.items()):
        end = prober.cut(t, p, start, last, marks) if (t, p) in capped else start
        if end > start:
            cut.append(OffsetRange(t, p, start, end))
    return tuple(cut), Cut(txid, lsn, ts_ms, offset + 1)


def _read_from(
    pipeline: PipelineConfig,
    done: Mapping[str, Cut | None],
    committed: Mapping[TopicPartition, int],
    marks: Mapping[TopicPartition, Watermarks],
) -> int | None:
    """Where the transaction topic is read from: the earliest cut of the tables with
    records to read (their records belong to transactions after it); its first offset
    when one of them has no cut yet."""
    after: list[int | None] = []
    for name, cut in done.items():
        table = pipeline.table_named(name)
        topic = pipeline.topic_for(table) if table is not None else ""
        if any(committed.get(tp, m.low) < m.high for tp, m in marks.items() if tp[0] == topic):
            after.append(cut.after if cut else None)
    return None if None in after else min((a for a in after if a is not None), default=None)


def transaction_ends(
    pipeline: PipelineConfig, consumer: Consumer, start: int | None
) -> list[tuple[int, int | None, int, int]]:
    """The END records of the transaction topic from `start` (default: its first), as
    (txid, commit LSN, commit time ms, offset), oldest first, up to the first not yet
    `SETTLED_MS` old."""
    from confluent_kafka import TopicPartition

    topic = pipeline.transaction_topic
    marks = fetch_watermarks(pipeline.kafka, [topic])
    if (topic, 0) not in marks:
        raise EndpointError(
            f"{pipeline.path}: consistency: transaction reads Debezium's transaction topic "
            f"{topic!r}, which Kafka does not have: set provide.transaction.metadata=true on "
            "the connector (or source.transaction_topic to its topic.transaction)"
        )
    low, high = marks[(topic, 0)].low, marks[(topic, 0)].high
    if max(low, start or 0) >= high:
        return []
    settled_ms = int(time.time() * 1000) - SETTLED_MS
    out = []
    consumer.assign([TopicPartition(topic, 0, max(low, start or 0))])
    for msg in _messages(consumer, topic, 0, high, pipeline.kafka.timeouts.request_s):
        note = _payload(pipeline, msg.value())
        if note.get("status") != "END":
            continue
        if msg.timestamp()[1] > settled_ms:
            break
        txid, _, lsn = str(note["id"]).partition(":")
        commit_lsn = int(lsn) if lsn.isdigit() else None
        out.append((int(txid), commit_lsn, int(note.get("ts_ms") or 0), int(msg.offset())))
    return out


class _Prober:
    """Reads single records of the data topics: the transaction order of the first
    record at or after an offset that belongs to a transaction."""

    def __init__(self, pipeline: PipelineConfig) -> None:
        self.pipeline = pipeline
        self.order: Mapping[int, int] = {}  # transaction id -> its place among those read
        self.past = 0  # the place of a transaction after all of those
        self.consumer = _consumer(pipeline)
        self.seen: dict[tuple[str, int, int], tuple[int, int] | None] = {}
        self.reads = 0

    def __enter__(self) -> _Prober:
        return self

    def __exit__(self, *_: object) -> None:
        self.consumer.close()

    def first_order(
        self, topic: str, partition: int, offset: int, marks: Mapping[TopicPartition, Watermarks]
    ) -> tuple[int, int]:
        """(order, offset) of the first record at or after `offset` in a transaction; the
        order of one not among the transactions read is past them all; (past them all,
        high) when there is none."""
        high = marks[(topic, partition)].high
        key = (topic, partition, offset)
        if key not in self.seen:
            self.seen[key] = self._read(topic, partition, offset, high)
        found = self.seen[key]
        return found if found is not None else (self.past, high)

    def cut(
        self,
        topic: str,
        partition: int,
        start: int,
        last: int,
        marks: Mapping[TopicPartition, Watermarks],
    ) -> int:
        """The offset of the first record from `start` in a transaction after the
        `last`-th (records outside any transaction before it go with the batch); the
        partition's end when there is none."""
        lo, hi = start, marks[(topic, partition)].high
        while lo < hi:
            mid = (lo + hi) // 2
            order, at = self.first_order(topic, partition, mid, marks)
            if order > last:
                hi = mid
            else:
                lo = at + 1
        return self.first_order(topic, partition, lo, marks)[1]

    def _read(self, topic: str, partition: int, offset: int, high: int) -> tuple[int, int] | None:
        from confluent_kafka import TopicPartition

        if offset >= high:
            return None
        self.consumer.assign([TopicPartition(topic, partition, offset)])
        timeout = self.pipeline.kafka.timeouts.request_s
        for msg in _messages(self.consumer, topic, partition, high, timeout):
            self.reads += 1
            txid = _txid(self.pipeline, msg.value())
            if txid is not None:
                return self.order.get(txid, self.past), int(cast(int, msg.offset()))
        return None


def _txid(pipeline: PipelineConfig, value: bytes | None) -> int | None:
    """The source transaction of a change record; None for a record outside any (a
    tombstone, a snapshot read)."""
    if value is None:
        return None
    payload = _payload(pipeline, value)
    if not payload.get("transaction"):
        return None
    txid = (payload.get("source") or {}).get("txId")
    return int(txid) if txid is not None else None


def _payload(pipeline: PipelineConfig, value: bytes | None) -> dict[str, Any]:
    if value is None:
        return {}
    registry = pipeline.kafka.schema_registry
    text = envelope(registry, value) if pipeline.kafka.format.avro and registry else value
    doc = json.loads(text)
    payload = doc.get("payload", doc) if isinstance(doc, dict) else None
    return payload if isinstance(payload, dict) else {}


def _consumer(pipeline: PipelineConfig) -> Consumer:
    from confluent_kafka import Consumer

    return Consumer(
        {
            **pipeline.kafka.client_config(),
            "group.id": "cdclake-consistency",
            "enable.auto.commit": False,
            # a probe reads one record: the broker answers at once (its default 500 ms
            # wait made each probe cost half a second)
            "fetch.wait.max.ms": 10,
        }
    )


def _messages(
    consumer: Consumer, topic: str, partition: int, high: int, timeout_s: float
) -> Iterator[Any]:
    """The records of the partition just assigned, up to `high` (records an earlier
    assignment fetched are skipped), each poll bounded, the whole read by `timeout_s`
    without a record."""
    deadline = time.monotonic() + timeout_s
    while True:
        msg = consumer.poll(POLL_S)
        if msg is None:
            if time.monotonic() > deadline:
                where = f"{topic}[{partition}]"
                raise EndpointError(f"Kafka: no record of {where} within {timeout_s:.0f}s")
            continue
        if msg.error() or (msg.topic(), msg.partition()) != (topic, partition):
            continue
        deadline = time.monotonic() + timeout_s
        yield msg
        if cast(int, msg.offset()) + 1 >= high:
            return
