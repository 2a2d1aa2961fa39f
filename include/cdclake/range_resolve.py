"""Big batches read and resolved in the same Spark tasks, one task per Kafka partition.

Debezium keys each record by its row's primary key, and Kafka's partitioner sends every
record of a key to one partition: all of a key's changes in a batch are then in one of
its offset ranges. So a task can read a whole range, split and decode its records and
fold each key's changes (`KeyFold`) as they come, holding each key's latest state only:
its memory grows with the range's keys, not its records. Nothing of the raw records is
cached, scanned or shuffled; only the resolved rows leave the task.

The lake schema of a topic is learnt from its records, so a task returns its rows as
Arrow IPC streams (`RANGE_SCHEMA`), with a summary of what it met. The driver reads the
summaries (`accept`): a topic whose every range resolved, with one key schema and one
value schema among them all, is unpacked into typed rows (`unpack`) and, when it has
more than one range, checked for a key found in two of them (a repartitioned topic, or
a producer routing records by something else than the key). Any other topic takes the
general path: its raw records are read again, cached and scanned, and resolved in tasks
grouped by key or by the Spark SQL jobs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cdclake.changes import DELETED, TopicSchema, topic_schema
from cdclake.driver_resolve import (
    NO_TOAST,
    KeyFold,
    RowShape,
    ToastColumns,
    Unsupported,
    arrow_type,
    check_key_types,
    columns_ddl,
    cycles_uncollected,
    decode_records,
    folds_table,
    is_placeholder,
    placeholder_of,
    result_columns,
    row_decoders,
    rows_table,
    tally,
)
from cdclake.exceptions import CdclakeError
from cdclake.reader import RangeReader
from cdclake.resolve import TOAST_PREFIX, TRUNCATE, toastable
from cdclake.scan import TOAST_TEXTS

if TYPE_CHECKING:
    import pyarrow as pa

# what a range task returns: rows of resolved rows (`data`, an Arrow IPC stream), then
# one summary row (`meta`, JSON) per range
RANGE_SCHEMA = "topic string, partition int, meta string, data binary"
BLOB_ROWS = 2_000  # resolved rows per IPC stream
# A range whose fold holds more keys than this (an initial snapshot: every record a new
# key) stops and its topic takes the general path, whose tasks hold ~50,000 records
# each: a task's memory stays bounded (a key's state is its latest row, ~5 KB of Python
# objects for the connector's rows of ~1 KB of values).
RANGE_KEYS = 100_000


@dataclass(frozen=True)
class TopicPlan:
    """What a range task needs to know of its topic's table."""

    topic: str
    exclude: tuple[str, ...] = ()
    known: Mapping[str, str] = field(default_factory=dict)  # the lake table's columns


@dataclass
class RangeSummary:
    """What one range task met. `reason` says why its topic must take the general path
    (None when the range resolved)."""

    topic: str
    partition: int
    records: int = 0
    reason: str | None = None
    key_schemas: list[tuple[int, str]] = field(default_factory=list)
    value_schemas: list[tuple[int, str]] = field(default_factory=list)
    counts: dict[bool, int] = field(default_factory=dict)  # resolved rows per deleted flag
    max_source_ms: int | None = None
    toast: bool = False  # a TOAST placeholder may be among the values (its text was seen)

    def to_json(self) -> str:
        out = self.__dict__ | {"counts": [[k, v] for k, v in self.counts.items()]}
        return json.dumps(out)

    @classmethod
    def from_json(cls, text: str) -> RangeSummary:
        data = json.loads(text)
        data["counts"] = {bool(k): v for k, v in data["counts"]}
        for side in ("key_schemas", "value_schemas"):
            data[side] = [tuple(x) for x in data[side]]
        return cls(**data)


class RangeFold:
    """The records of one offset range, folded batch by batch into each key's state."""

    def __init__(self, plan: TopicPlan, partition: int, follow_toast: bool = False) -> None:
        self.plan = plan
        # Until a TOAST placeholder's text is seen in the range, no key's fold needs its
        # changes' rows: they are decoded only for the changes written (`headers_only`).
        # A range that then meets one must be folded again from its start with every
        # row decoded (`restart`), which `range_task` does.
        self.follow_toast = follow_toast
        self.restart = False
        self.summary = RangeSummary(plan.topic, partition)
        self.schema: TopicSchema | None = None
        self._texts: dict[str, dict[int, str]] = {"key": {}, "value": {}}
        self._pending: list[pa.RecordBatch] = []  # read before a value schema was seen
        self._decoders = None
        self._toast_cols: list = []
        self._toast_of = NO_TOAST
        self.states: dict[tuple, KeyFold] = {}

    @property
    def reason(self) -> str | None:
        return self.summary.reason

    def add(self, raw: pa.RecordBatch) -> bool:
        """Fold the raw rows in; False once the range must take the general path."""
        if self.reason is not None or self.restart:
            return False
        self.summary.records += raw.num_rows
        self._guarded(self._add, raw)
        return self.reason is None and not self.restart

    def _guarded(self, step, *args) -> None:
        try:
            step(*args)
        except Unsupported as why:
            self.summary.reason = str(why)
        except CdclakeError as exc:  # e.g. a schema the lake cannot take
            self.summary.reason = str(exc)

    def _add(self, raw: pa.RecordBatch) -> None:
        import pyarrow.compute as pc

        if raw.column(raw.schema.get_field_index("error")).null_count != raw.num_rows:
            raise Unsupported("a record that is not a JSON-with-schema envelope")
        for side in ("key", "value"):
            ids = raw.column(raw.schema.get_field_index(f"{side}_schema_id"))
            texts = raw.column(raw.schema.get_field_index(f"{side}_schema"))
            if texts.null_count != len(texts):  # the reader sends a schema's text once
                sent = pc.is_valid(texts)
                for sid, text in zip(pc.filter(ids, sent).to_pylist(),
                                     pc.filter(texts, sent).to_pylist(), strict=True):  # fmt: skip
                    self._texts[side].setdefault(sid, text)
            seen = self._texts[side]
            if len(seen) > 1:
                raise Unsupported(f"{len(seen)} {side} schemas in one partition")
            if ids.null_count != len(ids) and (
                not seen or pc.any(pc.not_equal(ids, next(iter(seen)))).as_py()
            ):
                raise Unsupported(f"a {side} schema whose text the reader did not send")
        payloads = raw.column(raw.schema.get_field_index("value_payload"))
        if not self.summary.toast and holds_any(payloads, TOAST_TEXTS):
            self.summary.toast = True
            if not self.follow_toast:
                self.restart = True
                return
        if self.schema is None:
            self._pending.append(raw)
            if self._texts["value"]:
                self._fold_pending()
            return
        self._fold(raw)

    def _fold_pending(self) -> None:
        """Start with the schemas seen and fold the batches held until then."""
        self._start()
        pending, self._pending = self._pending, []
        for batch in pending:
            self._fold(batch)

    def _start(self) -> None:
        keys, values = self._texts["key"], self._texts["value"]
        if not keys:
            raise Unsupported("the table has no key")
        self.schema = topic_schema(list(keys.values()), list(values.values()), (),
                                   self.plan.topic, self.plan.exclude, self.plan.known)  # fmt: skip
        check_key_types(self.schema)
        self._decoders = row_decoders(self.schema, keys, values)
        self._toast_cols = toastable(self.schema)
        self._toast_of = ToastColumns(self._toast_cols)

    def _fold(self, raw: pa.RecordBatch) -> None:
        schema, states, toast = self.schema, self.states, self._toast_of
        lean = not self.follow_toast
        changes = decode_records(raw, schema, self._texts["key"], self._texts["value"],
                                 self._decoders, headers_only=lean)  # fmt: skip
        if lean:
            toast = NO_TOAST
        for c in changes:
            if c.op == TRUNCATE:
                raise Unsupported(f"a truncate at offset {c.offset}")
            key = c.ident
            if c.is_tombstone and all(v is None for v in key):
                continue  # a tombstone without key carries nothing
            fold = states.get(key)
            if fold is None:
                fold = states[key] = KeyFold()
            fold.add(c, toast)
        if len(states) > RANGE_KEYS:
            raise Unsupported(f"more than {RANGE_KEYS:,} keys in one partition's range")

    def finish(self) -> Iterator[pa.RecordBatch]:
        """The resolved rows (IPC streams of up to `BLOB_ROWS` rows), then the summary."""
        summary = self.summary
        assert not self.restart, "a range that met a TOAST placeholder is folded again"
        if summary.reason is None and self.schema is None:
            if not self._pending:
                summary.reason = "no records"
            else:  # only tombstones: they delete rows of the columns the lake has
                self._guarded(self._fold_pending)
        if summary.reason is None:
            summary.key_schemas = list(self._texts["key"].items())
            summary.value_schemas = list(self._texts["value"].items())
            shape = RowShape(self.schema, self._toast_of if summary.toast else NO_TOAST)
            columns = result_columns(self.schema, True, summary.toast)
            folds: list[tuple[tuple, KeyFold]] = []
            try:
                while self.states:
                    key, fold = self.states.popitem()
                    if fold.r is not None:  # None: every change of the key was dropped
                        folds.append((key, fold))
                    if folds and (len(folds) == BLOB_ROWS or not self.states):
                        if summary.toast:
                            table = rows_table([f.row(k, shape) for k, f in folds], columns)
                        else:
                            table = folds_table(folds, shape, columns)
                            _no_placeholder(table, self._toast_cols)
                        summary.max_source_ms = tally(table, summary.counts,
                                                      summary.max_source_ms)  # fmt: skip
                        yield self._out(_ipc(table))
                        folds = []
            except Unsupported as why:
                summary.reason = str(why)
        yield self._out(None, summary.to_json())

    def _out(self, data: bytes | None, meta: str | None = None) -> pa.RecordBatch:
        import pyarrow as pa

        return pa.RecordBatch.from_pydict(
            {"topic": [self.plan.topic], "partition": [self.summary.partition],
             "meta": [meta], "data": [data]},
            schema=pa.schema([("topic", pa.string()), ("partition", pa.int32()),
                              ("meta", pa.string()), ("data", pa.binary())]),
        )  # fmt: skip


def holds_any(texts: pa.Array, needles: Sequence[str]) -> bool:
    """Whether any value of a text array holds any of `needles`. The values' bytes lie
    one after the other in the array's data buffer, so it is searched whole (one copy,
    then a byte search per needle: ~5× `match_substring` over a read batch of
    payloads). A needle without `{`, `}` or `"` is never found across two JSON objects;
    across other text it can only make the answer yes, which costs a range the TOAST
    flags (all False then), never a placeholder written as a value."""
    import numpy as np
    import pyarrow as pa

    if len(texts) == texts.null_count:
        return False
    _, offsets, data = texts.buffers()
    if data is None:
        return False
    width = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    bounds = np.frombuffer(offsets, dtype=width, count=len(texts) + 1,
                           offset=texts.offset * np.dtype(width).itemsize)  # fmt: skip
    whole = memoryview(data)[int(bounds[0]) : int(bounds[-1])].tobytes()
    return any(n.encode() in whole for n in needles)


def _no_placeholder(table: pa.Table, toast_cols) -> None:
    """Rows resolved without the TOAST flags (the text search saw no placeholder in the
    range) must not carry one in a live row: it would be written as the value."""
    import pyarrow as pa
    import pyarrow.compute as pc

    live = pc.invert(table.column(DELETED))
    for col in toast_cols:
        values, mark = table.column(col.name), placeholder_of(col)
        if pa.types.is_string(values.type) or pa.types.is_binary(values.type):
            found = pc.any(pc.and_(pc.equal(values, mark), live)).as_py()
        else:
            found = any(alive and is_placeholder(v, col) for v, alive in
                        zip(values.to_pylist(), live.to_pylist(), strict=True))  # fmt: skip
        if found:
            raise Unsupported(f"a TOAST placeholder in column {col.name!r} that the text "
                              "search did not see")  # fmt: skip


def _ipc(table: pa.Table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def range_task(reader: RangeReader, plans: Mapping[str, TopicPlan]):
    """A `mapInArrow` function over range rows (`reader.range_plan`): each range read
    whole by `reader` and resolved (`RANGE_SCHEMA`). A range that must take the general
    path stops reading at once and returns its summary only."""
    plans = dict(plans)

    def task(batches):
        for batch in batches:
            for r in batch.to_pylist():
                fold = _read_range(reader, r, RangeFold(plans[r["topic"]], r["partition"]))
                if fold.restart:  # a TOAST placeholder: read again, following TOAST
                    fold = RangeFold(plans[r["topic"]], r["partition"], follow_toast=True)
                    fold = _read_range(reader, r, fold)
                yield from fold.finish()

    return task


def _read_range(reader: RangeReader, r: dict, fold: RangeFold) -> RangeFold:
    records = reader(r)
    try:
        with cycles_uncollected():  # the keys' states pile up as it reads
            for raw in records:
                if not fold.add(raw):
                    break
    finally:
        close = getattr(records, "close", None)
        if close is not None:
            close()
    return fold


@dataclass(frozen=True)
class AcceptedTopic:
    """A topic whose ranges all resolved: its schemas (as `RawScan.schemas` gives them),
    the rows' columns, and what the summaries add up to."""

    schemas: dict[str, list[tuple[int, str]]]
    columns: list[tuple[str, str]]  # (name, Spark type) of the resolved rows
    key_names: tuple[str, ...]
    toast: bool
    counts: dict[bool, int]
    max_source_ms: int | None
    ranges: int

    @property
    def ddl(self) -> str:
        return columns_ddl(self.columns)


def accept(summaries: Sequence[RangeSummary], plan: TopicPlan) -> AcceptedTopic | str:
    """The topic's ranges taken together, or why the topic takes the general path."""
    for s in summaries:
        if s.reason is not None:
            return f"partition {s.partition}: {s.reason}"
    keys = {sid: text for s in summaries for sid, text in s.key_schemas}
    values = {sid: text for s in summaries for sid, text in s.value_schemas}
    if len(keys) != 1 or len(values) > 1:
        return f"{len(keys)} key and {len(values)} value schemas among the partitions"
    schema = topic_schema(list(keys.values()), list(values.values()), (), plan.topic,
                          plan.exclude, plan.known)  # fmt: skip
    toast = any(s.toast for s in summaries)
    counts: dict[bool, int] = {}
    for s in summaries:
        for deleted, n in s.counts.items():
            counts[deleted] = counts.get(deleted, 0) + n
    stamps = [s.max_source_ms for s in summaries if s.max_source_ms is not None]
    return AcceptedTopic(
        {"key": list(keys.items()), "value": list(values.items())},
        result_columns(schema, True, toast), schema.key_names, toast, counts,
        max(stamps) if stamps else None, len(summaries),
    )  # fmt: skip


def unpack_task(columns: Sequence[tuple[str, str]]):
    """A `mapInArrow` function: the IPC streams of `data` -> the rows, of these (name,
    Spark type) columns (TOAST flags a range did not carry, since it saw no placeholder,
    are False)."""
    columns = list(columns)

    def task(batches):
        import pyarrow as pa

        schema = pa.schema([pa.field(n, arrow_type(t)) for n, t in columns])
        for batch in batches:
            for data in batch.column(0).to_pylist():
                if data is None:
                    continue
                table = pa.ipc.open_stream(data).read_all()
                arrays = []
                for f in schema:
                    if f.name in table.column_names:
                        arrays.append(table[f.name])
                    elif f.name.startswith(TOAST_PREFIX):
                        arrays.append(pa.array([False] * table.num_rows, pa.bool_()))
                    else:  # a range of tombstones only: its rows are deletes, no values
                        arrays.append(pa.nulls(table.num_rows, f.type))
                yield from pa.Table.from_arrays(arrays, schema=schema).to_batches()

    return task
