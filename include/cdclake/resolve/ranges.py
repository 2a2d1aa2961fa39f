"""Big batches read and resolved in the same Spark tasks, one task per Kafka partition.

Debezium keys each record by its row's primary key, and Kafka's partitioner sends every
record of a key to one partition: all of a key's changes in a batch are then in one of
its offset ranges. So a task can read a whole range, split and decode its records and
fold each key's changes (`KeyFold`, the one resolve's) as they come, holding each key's
latest state only: its memory grows with the range's keys, not its records. Nothing of
the raw records is cached, scanned or shuffled; only the resolved rows leave the task. A
truncate starts the range's fold again: what came before it in its partition is dropped,
as the resolve of the whole topic drops it. A table
without a key is a changelog, a row per change: its ranges return each read batch's rows
as they are decoded (`RangeFold.drain`), holding nothing.

The driver first reads the head of the topic's ranges for its key and value schemas
(`head_schemas`): they give the lake columns, so the tasks return typed rows
(`TopicPlan.ddl`), then one summary row per range of what it met, with a hash of each of
its keys. A range that meets any other schema stops. The driver reads the summaries
(`accept`): a topic whose every range resolved, and with more than one range no key
found in two of them (a repartitioned topic, or a producer routing records by something
else than the key), keeps its rows. With a truncate, the other partitions' ranges must
hold no change at or below its LSN, which the resolve of the whole topic would drop. Any
other topic takes the general path: its raw records are read again, cached and scanned,
and resolved in tasks over all the records of their keys.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from cdclake.debezium.json_records import (
    decode_records,
    row_decoders,
)
from cdclake.debezium.json_values import Unsupported
from cdclake.debezium.schema import TopicSchema, topic_schema
from cdclake.exceptions import CdclakeError
from cdclake.kafka.reader import RangeReader
from cdclake.resolve.fold import (
    NO_TOAST,
    KeyFold,
    RowShape,
    ToastColumns,
    changelog_rows,
    check_key_types,
    folds_table,
    is_placeholder,
    placeholder_of,
)
from cdclake.resolve.rows import (
    arrow_type,
    columns_ddl,
    cycles_uncollected,
    result_columns,
    rows_table,
    tally,
)
from cdclake.resolve.rules import TOAST_PLACEHOLDER, TOAST_PREFIX, TRUNCATE, Truncate, toastable

if TYPE_CHECKING:
    import pyarrow as pa

# the columns a range task returns after the resolved rows' (`TopicPlan.ddl`): on the
# summary row of each range, its summary (JSON) and its keys' hashes (`key_hashes`)
# how a TOAST placeholder appears in a payload: as text, or as base64 of its bytes
TOAST_TEXTS = (TOAST_PLACEHOLDER, base64.b64encode(TOAST_PLACEHOLDER.encode()).decode()[:36])
META_COLUMN = "_cdclake_range_meta"
KEYS_COLUMN = "_cdclake_range_keys"
BATCH_ROWS = 2_000  # resolved rows per Arrow batch a task returns
# A range whose fold holds more keys than this (an initial snapshot: every record a new
# key) stops and its topic takes the general path, whose tasks hold ~50,000 records
# each: a task's memory stays bounded (a key's state is its latest row, ~5 KB of Python
# objects for the connector's rows of ~1 KB of values).
RANGE_KEYS = 100_000
HEAD_RECORDS = 100  # records of a range's head read for the topic's schemas
Schema = tuple[int, str]  # a Connect schema's id and text


def local_path(uri: str) -> str | None:
    """The local path of a `file:` URI (or of a bare absolute path); None for any other
    location."""
    from urllib.parse import unquote, urlsplit

    if uri.startswith("/"):
        return uri
    parts = urlsplit(uri)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        return None
    return unquote(parts.path)


@dataclass(frozen=True)
class TopicPlan:
    """What a range task needs to know of its topic and its table: the key and value
    schemas (id, text) every record must carry, from the head of the topic's ranges
    (`head_schemas`; no value schema: tombstones only, of the lake table's columns), and
    the lake table's columns."""

    topic: str
    key_schema: Schema | None  # None: no Kafka key (without `key`, a changelog)
    value_schema: Schema | None
    exclude: tuple[str, ...] = ()
    known: Mapping[str, str] = field(default_factory=dict)  # the lake table's columns
    key: tuple[str, ...] = ()  # the table's configured key columns (else the Kafka key's)

    @cached_property
    def schema(self) -> TopicSchema:
        keys = [] if self.key_schema is None else [self.key_schema[1]]
        values = [] if self.value_schema is None else [self.value_schema[1]]
        return topic_schema(keys, values, self.key, self.topic, self.exclude, self.known)

    def columns(self, toast: bool = True) -> list[tuple[str, str]]:
        """(name, Spark type) of the resolved rows; `toast`: with the TOAST flags (a
        keyed table's)."""
        return result_columns(self.schema, bool(self.schema.key_names), toast)

    @property
    def ddl(self) -> str:
        """The schema of what a range task returns."""
        return f"{columns_ddl(self.columns())}, `{META_COLUMN}` string, `{KEYS_COLUMN}` binary"


def head_schemas(reader: RangeReader, ranges: Sequence[dict],
                 records: int = HEAD_RECORDS) -> tuple[Schema, Schema | None] | None:  # fmt: skip
    """The key and value schemas (id, text) of the first records that carry them, read
    from the head (`records`) of each range in turn: no value schema (None) when the
    heads hold tombstones only; no key schema (None) when their records have no key (a
    table without one); None when they hold no schema at all."""
    import pyarrow.compute as pc

    found: dict[str, Schema] = {}
    for r in ranges:
        head = {**r, "end": min(r["end"], r["start"] + records)}
        batches = reader(head)
        try:
            for raw in batches:
                for side in ("key", "value"):
                    texts = raw.column(raw.schema.get_field_index(f"{side}_schema"))
                    if side in found or texts.null_count == len(texts):
                        continue
                    at = pc.index(pc.is_valid(texts), True).as_py()
                    sid = raw.column(raw.schema.get_field_index(f"{side}_schema_id"))[at]
                    found[side] = (sid.as_py(), texts[at].as_py())
                if len(found) == 2:
                    return found["key"], found["value"]
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
    return (found.get("key"), found.get("value")) if found else None


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
    truncate: list | None = None  # the range's last truncate: [offset, LSN or None]
    first_lsn: int | None = None  # the lowest LSN of the changes folded

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
        # Until a TOAST placeholder's text is seen no key's fold needs its changes' rows:
        # they are decoded only for the changes written (`headers_only`), and a range
        # that then meets one must be folded again from its start with every row decoded
        # (`restart`), which `range_task` does.
        self.follow_toast = follow_toast
        self.restart = False
        self.summary = RangeSummary(plan.topic, partition)
        self.schema: TopicSchema | None = None
        self._planned = {"key": plan.key_schema, "value": plan.value_schema}
        self._texts = {side: dict([s] if s else []) for side, s in self._planned.items()}
        self._seen = {"key": False, "value": False}
        self._decoders = None
        self._toast_cols: list = []
        self._toast_of = NO_TOAST
        self.states: dict[tuple, KeyFold] = {}
        self._hashes: list = []  # each returned batch's key hashes
        # a table without a key: every change is a row (`changelog_rows`), returned as
        # each read batch is decoded (`drain`), nothing held
        self.changelog = False
        self._pending: list = []
        self._guarded(self._start)

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
            if ids.null_count == len(ids):
                continue
            planned = self._planned[side]
            if planned is None or pc.any(pc.not_equal(ids, planned[0])).as_py():
                raise Unsupported(f"a {side} schema other than the one read at the head of "
                                  "the topic's ranges")  # fmt: skip
            self._seen[side] = True
        if self.changelog:
            self._log(raw)
            return
        payloads = raw.column(raw.schema.get_field_index("value_payload"))
        if not self.summary.toast and holds_any(payloads, TOAST_TEXTS):
            self.summary.toast = True
            if not self.follow_toast:
                self.restart = True
                return
        self._fold(raw)

    def _start(self) -> None:
        keys, values = self._texts["key"], self._texts["value"]
        self.schema = self.plan.schema
        if not self.schema.key_names:
            self.changelog = True
            self._decoders = row_decoders(self.schema, keys, values)
            return
        check_key_types(self.schema)
        self._decoders = row_decoders(self.schema, keys, values)
        self._toast_cols = toastable(self.schema)
        self._toast_of = ToastColumns(self._toast_cols)

    def _start_again(self, truncate) -> None:
        """Drop what the fold holds, at a truncate (a change): the summary keeps its
        position, and the lowest LSN is counted again from after it."""
        self.summary.truncate = [truncate.offset, truncate.lsn]
        self.summary.first_lsn = None
        self.states.clear()

    def _fold(self, raw: pa.RecordBatch) -> None:
        schema, states, toast = self.schema, self.states, self._toast_of
        lean = not self.follow_toast
        changes = decode_records(raw, schema, self._texts["key"], self._texts["value"],
                                 self._decoders, headers_only=lean)  # fmt: skip
        if lean:
            toast = NO_TOAST
        first = self.summary.first_lsn
        for c in changes:
            if c.op == TRUNCATE:
                self._start_again(c)
                first = None
                continue
            if c.lsn is not None and (first is None or c.lsn < first):
                first = c.lsn
            key = c.ident
            if c.is_tombstone and all(v is None for v in key):
                continue  # a tombstone without key carries nothing
            fold = states.get(key)
            if fold is None:
                fold = states[key] = KeyFold()
            fold.add(c, toast)
        self.summary.first_lsn = first
        if len(states) > RANGE_KEYS:
            raise Unsupported(f"more than {RANGE_KEYS:,} keys in one partition's range")

    def _log(self, raw: pa.RecordBatch) -> None:
        """A table without a key: the read batch's changes as rows (`changelog_rows`,
        which also replaces TOAST placeholders), for `drain`."""
        changes = decode_records(raw, self.schema, self._texts["key"], self._texts["value"],
                                 self._decoders)  # fmt: skip
        rows = changelog_rows(changes, self.schema)
        if rows:
            self._pending.append(rows_table(rows, self.plan.columns()))

    def drain(self) -> Iterator[pa.RecordBatch]:
        """The rows of a table without a key decoded so far (batches of `TopicPlan.ddl`),
        counted into the summary."""
        summary = self.summary
        while self._pending:
            table = self._pending.pop(0)
            summary.max_source_ms = tally(table, summary.counts, summary.max_source_ms)
            yield from self._out(table)

    def finish(self) -> Iterator[pa.RecordBatch]:
        """The resolved rows (batches of up to `BATCH_ROWS` rows, of `TopicPlan.ddl`),
        then the summary row."""
        summary = self.summary
        assert not self.restart, "a range to fold again is folded again"
        if summary.reason is None and not summary.records:
            summary.reason = "no records"
        if summary.reason is None and self.changelog:
            yield from self.drain()
        if summary.reason is None:
            for side in ("key", "value"):
                if self._seen[side]:
                    setattr(summary, f"{side}_schemas", list(self._texts[side].items()))
        if summary.reason is None and not self.changelog:
            columns = result_columns(self.schema, True, summary.toast)
            try:
                for table in self._tables(columns):
                    if not summary.toast:
                        _no_placeholder(table, self._toast_cols)
                    summary.max_source_ms = tally(table, summary.counts,
                                                  summary.max_source_ms)  # fmt: skip
                    self._hashes.append(key_hashes(table, self.schema.key_names))
                    yield from self._out(table)
            except Unsupported as why:
                summary.reason = str(why)
        yield from self._out(None, summary)

    def _tables(self, columns: list[tuple[str, str]]) -> Iterator[pa.Table]:
        """The resolved rows, `BATCH_ROWS` at a time."""
        shape = RowShape(self.schema, self._toast_of if self.summary.toast else NO_TOAST)
        folds: list[tuple[tuple, KeyFold]] = []
        while self.states:
            key, fold = self.states.popitem()
            if fold.r is not None:  # None: every change of the key was dropped
                folds.append((key, fold))
            if folds and (len(folds) == BATCH_ROWS or not self.states):
                if self.summary.toast:
                    yield rows_table([f.row(k, shape) for k, f in folds], columns)
                else:
                    yield folds_table(folds, shape, columns)
                folds = []

    def _out(self, table: pa.Table | None,
             summary: RangeSummary | None = None) -> Iterator[pa.RecordBatch]:  # fmt: skip
        """Resolved rows (`table`, with the TOAST flags it lacks, False) or the summary
        row (every column of a row null) as batches of the plan's `ddl`."""
        import numpy as np
        import pyarrow as pa

        columns = self.plan.columns()
        rows = 1 if table is None else table.num_rows
        arrays = []
        for name, type_ in columns:
            if table is not None and name in table.column_names:
                arrays.append(table.column(name))
            elif table is not None and name.startswith(TOAST_PREFIX):
                arrays.append(pa.array(np.zeros(rows, dtype=bool)))
            else:
                arrays.append(pa.nulls(rows, arrow_type(type_)))
        if summary is None:
            arrays += [pa.nulls(rows, pa.string()), pa.nulls(rows, pa.binary())]
        else:
            hashes = np.concatenate(self._hashes) if self._hashes else np.zeros(0, np.uint64)
            arrays += [pa.array([summary.to_json()]), pa.array([hashes.tobytes()])]
        names = [n for n, _ in columns] + [META_COLUMN, KEYS_COLUMN]
        yield from pa.Table.from_arrays(arrays, names=names).to_batches()


def key_hashes(table: pa.Table, key_names: Sequence[str]):
    """A 64-bit number for each row's key (numpy uint64): equal keys give equal numbers,
    as Spark groups them. One integer key column is its own number; other keys are
    hashed (two keys of one number make their topic take the general path, never a
    wrong row)."""
    import hashlib

    import numpy as np
    import pyarrow as pa

    columns = [table.column(n) for n in key_names]
    if (len(columns) == 1 and pa.types.is_integer(columns[0].type)
            and columns[0].null_count == 0):  # fmt: skip
        return columns[0].cast(pa.int64()).to_numpy().view(np.uint64)
    blake = hashlib.blake2b
    values = zip(*(c.to_pylist() for c in columns), strict=True)
    return np.fromiter(
        (int.from_bytes(blake(repr(k).encode(), digest_size=8).digest(), "little")
         for k in values),
        dtype=np.uint64, count=table.num_rows,
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
    range) must not carry one: it would be written as the value (a deleted key's row
    too, with soft deletes)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for col in toast_cols:
        values, mark = table.column(col.name), placeholder_of(col)
        if pa.types.is_string(values.type) or pa.types.is_binary(values.type):
            found = pc.any(pc.equal(values, mark)).as_py()
        else:
            found = any(is_placeholder(v, col) for v in values.to_pylist())
        if found:
            raise Unsupported(f"a TOAST placeholder in column {col.name!r} that the text "
                              "search did not see")  # fmt: skip


def range_task(reader: RangeReader, plans: Mapping[str, TopicPlan]):
    """A `mapInArrow` function over range rows (`reader.range_plan`): each range read
    whole by `reader` and resolved (`TopicPlan.ddl`). A range that must take the general
    path stops reading at once and returns its summary only."""
    plans = dict(plans)

    def task(batches):
        for batch in batches:
            for r in batch.to_pylist():
                plan, partition = plans[r["topic"]], r["partition"]
                if not plan.schema.key_names:  # returned as it is read
                    yield from _stream_range(reader, r, RangeFold(plan, partition))
                    continue
                fold = _read_range(reader, r, RangeFold(plan, partition))
                while fold.restart:
                    # read again, following TOAST: a placeholder was met
                    fold = RangeFold(plan, partition, follow_toast=True)
                    fold = _read_range(reader, r, fold)
                yield from fold.finish()

    return task


def _stream_range(reader: RangeReader, r: dict, fold: RangeFold) -> Iterator[pa.RecordBatch]:
    """A range of a table without a key, its rows returned after each read batch (a
    range's memory is one read batch's, whatever its size), then its summary."""
    yield from _folding(reader, r, fold)
    yield from fold.finish()


def _read_range(reader: RangeReader, r: dict, fold: RangeFold) -> RangeFold:
    with cycles_uncollected():  # the keys' states pile up as it reads
        for _ in _folding(reader, r, fold):  # a keyed fold returns its rows at `finish`
            raise AssertionError("a range without a key is read by `_stream_range`")
    return fold


def _folding(reader: RangeReader, r: dict, fold: RangeFold) -> Iterator[pa.RecordBatch]:
    """Read the range into `fold` until it is read whole or the fold stops, returning
    what it has to return as it reads (`drain`); the reader is closed either way."""
    records = reader(r)
    try:
        for raw in records:
            going = fold.add(raw)
            yield from fold.drain()
            if not going:
                break
    finally:
        close = getattr(records, "close", None)
        if close is not None:
            close()


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
    truncate: Truncate | None = None  # the batch's last truncate, as the Spark jobs find it

    @property
    def ddl(self) -> str:
        return columns_ddl(self.columns)


def accept(summaries: Sequence[RangeSummary], plan: TopicPlan,
           hashes: Sequence | None = None) -> AcceptedTopic | str:  # fmt: skip
    """The topic's ranges taken together, or why the topic takes the general path.
    `hashes`: each range's key hashes (`key_hashes`), which must not share a number."""
    import numpy as np

    for s in summaries:
        if s.reason is not None:
            return f"partition {s.partition}: {s.reason}"
    # every range met the plan's schemas only (`RangeFold`): these are they, as met
    keys = {sid: text for s in summaries for sid, text in s.key_schemas}
    values = {sid: text for s in summaries for sid, text in s.value_schemas}
    if hashes is not None and len(hashes) > 1:
        every = np.concatenate(hashes)
        if len(np.unique(every)) != len(every):
            return "a key is in more than one partition"
    truncate = _truncate(summaries)
    if isinstance(truncate, str):
        return truncate
    toast = any(s.toast for s in summaries)
    counts: dict[bool, int] = {}
    for s in summaries:
        for deleted, n in s.counts.items():
            counts[deleted] = counts.get(deleted, 0) + n
    stamps = [s.max_source_ms for s in summaries if s.max_source_ms is not None]
    return AcceptedTopic(
        {"key": list(keys.items()), "value": list(values.items())},
        plan.columns(toast), plan.schema.key_names, toast, counts,
        max(stamps) if stamps else None, len(summaries), truncate,
    )  # fmt: skip


def _truncate(summaries: Sequence[RangeSummary]) -> Truncate | str | None:
    """The topic's last truncate, or why its ranges cannot take it. Each range started
    its fold again after its own last truncate. The Spark jobs drop, in the other
    partitions, the changes at or below the truncate's LSN: resolved whole, those ranges
    can be kept only when they hold no such change. Truncates in two partitions each
    drop their own partition's changes before them, which the Spark jobs do for the
    last one only."""
    cut = [s for s in summaries if s.truncate is not None]
    if not cut:
        return None
    if len({s.partition for s in cut}) > 1:
        return "truncates in more than one partition"
    last = max(cut, key=lambda s: s.truncate[0])
    offset, lsn = last.truncate
    for s in summaries:
        if (s.partition != last.partition and lsn is not None and s.first_lsn is not None
                and s.first_lsn <= lsn):  # fmt: skip
            return (f"a truncate in partition {last.partition} after changes of partition "
                    f"{s.partition}")  # fmt: skip
    return Truncate(last.partition, offset, lsn)
