"""Big batches read and resolved in the same Spark tasks, one task per Kafka partition.

Debezium keys each record by its row's primary key, and Kafka's partitioner sends every
record of a key to one partition: all of a key's changes in a batch are then in one of
its offset ranges. So a task can read a whole range, split and decode its records and
fold each key's changes (`KeyFold`) as they come, holding each key's latest state only:
its memory grows with the range's keys, not its records. Nothing of the raw records is
cached, scanned or shuffled; only the resolved rows leave the task.

The driver first reads the head of the topic's ranges for its key and value schemas
(`head_schemas`): they give the lake columns, so the tasks return typed rows
(`TopicPlan.ddl`), then one summary row per range of what it met, with a hash of each of
its keys. A range that meets any other schema stops. The driver reads the summaries
(`accept`): a topic whose every range resolved, and with more than one range no key
found in two of them (a repartitioned topic, or a producer routing records by something
else than the key), keeps its rows. Any other topic takes the general path: its raw
records are read again, cached and scanned, and resolved in tasks grouped by key or by
the Spark SQL jobs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
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

# the columns a range task returns after the resolved rows' (`TopicPlan.ddl`): on the
# summary row of each range, its summary (JSON) and its keys' hashes (`key_hashes`)
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


@dataclass(frozen=True)
class TopicPlan:
    """What a range task needs to know of its topic and its table: the key and value
    schemas (id, text) every record must carry, from the head of the topic's ranges
    (`head_schemas`; no value schema: tombstones only, of the lake table's columns), and
    the lake table's columns."""

    topic: str
    key_schema: Schema
    value_schema: Schema | None
    exclude: tuple[str, ...] = ()
    known: Mapping[str, str] = field(default_factory=dict)  # the lake table's columns

    @cached_property
    def schema(self) -> TopicSchema:
        values = [] if self.value_schema is None else [self.value_schema[1]]
        return topic_schema([self.key_schema[1]], values, (), self.topic, self.exclude,
                            self.known)  # fmt: skip

    def columns(self, toast: bool = True) -> list[tuple[str, str]]:
        """(name, Spark type) of the resolved rows; `toast`: with the TOAST flags."""
        return result_columns(self.schema, True, toast)

    @property
    def ddl(self) -> str:
        """The schema of what a range task returns."""
        return f"{columns_ddl(self.columns())}, `{META_COLUMN}` string, `{KEYS_COLUMN}` binary"


def head_schemas(reader: RangeReader, ranges: Sequence[dict],
                 records: int = HEAD_RECORDS) -> tuple[Schema, Schema | None] | None:  # fmt: skip
    """The key and value schemas (id, text) of the first records that carry them, read
    from the head (`records`) of each range in turn: no value schema (None) when the
    heads hold tombstones only; None when they hold no key schema."""
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
    return None if "key" not in found else (found["key"], found.get("value"))


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
        self._planned = {"key": plan.key_schema, "value": plan.value_schema}
        self._texts = {side: dict([s] if s else []) for side, s in self._planned.items()}
        self._seen = {"key": False, "value": False}
        self._decoders = None
        self._toast_cols: list = []
        self._toast_of = NO_TOAST
        self.states: dict[tuple, KeyFold] = {}
        self._hashes: list = []  # each returned batch's key hashes
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
            raise Unsupported("the table has no key")
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
        """The resolved rows (batches of up to `BATCH_ROWS` rows, of `TopicPlan.ddl`),
        then the summary row."""
        summary = self.summary
        assert not self.restart, "a range that met a TOAST placeholder is folded again"
        if summary.reason is None and not summary.records:
            summary.reason = "no records"
        if summary.reason is None:
            for side in ("key", "value"):
                if self._seen[side]:
                    setattr(summary, f"{side}_schemas", list(self._texts[side].items()))
            shape = RowShape(self.schema, self._toast_of if summary.toast else NO_TOAST)
            columns = result_columns(self.schema, True, summary.toast)
            folds: list[tuple[tuple, KeyFold]] = []
            try:
                while self.states:
                    key, fold = self.states.popitem()
                    if fold.r is not None:  # None: every change of the key was dropped
                        folds.append((key, fold))
                    if folds and (len(folds) == BATCH_ROWS or not self.states):
                        if summary.toast:
                            table = rows_table([f.row(k, shape) for k, f in folds], columns)
                        else:
                            table = folds_table(folds, shape, columns)
                            _no_placeholder(table, self._toast_cols)
                        summary.max_source_ms = tally(table, summary.counts,
                                                      summary.max_source_ms)  # fmt: skip
                        self._hashes.append(key_hashes(table, self.schema.key_names))
                        yield from self._out(table)
                        folds = []
            except Unsupported as why:
                summary.reason = str(why)
        yield from self._out(None, summary)

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


def range_task(reader: RangeReader, plans: Mapping[str, TopicPlan]):
    """A `mapInArrow` function over range rows (`reader.range_plan`): each range read
    whole by `reader` and resolved (`TopicPlan.ddl`). A range that must take the general
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
    toast = any(s.toast for s in summaries)
    counts: dict[bool, int] = {}
    for s in summaries:
        for deleted, n in s.counts.items():
            counts[deleted] = counts.get(deleted, 0) + n
    stamps = [s.max_source_ms for s in summaries if s.max_source_ms is not None]
    return AcceptedTopic(
        {"key": list(keys.items()), "value": list(values.items())},
        plan.columns(toast), plan.schema.key_names, toast, counts,
        max(stamps) if stamps else None, len(summaries),
    )  # fmt: skip
