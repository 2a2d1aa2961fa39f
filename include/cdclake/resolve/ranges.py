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

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from cdclake.debezium.formats import Unsupported
from cdclake.debezium.schema import TopicSchema
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
from cdclake.resolve.range_plan import KEYS_COLUMN, META_COLUMN, RangeSummary, TopicPlan
from cdclake.resolve.rows import (
    arrow_type,
    cycles_uncollected,
    result_columns,
    rows_table,
    tally,
)
from cdclake.resolve.rules import TOAST_PREFIX, TRUNCATE, toastable

if TYPE_CHECKING:
    import pyarrow as pa

BATCH_ROWS = 2_000  # resolved rows per Arrow batch a task returns


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
        if not self.summary.toast and holds_any(payloads, self.plan.tuning.toast_texts):
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
            self._decoders = self.schema.format.codec.row_decoders(self.schema, keys, values)
            return
        check_key_types(self.schema)
        self._decoders = self.schema.format.codec.row_decoders(self.schema, keys, values)
        self._toast_cols = toastable(self.schema)
        self._toast_of = ToastColumns(self._toast_cols)

    def _start_again(self, truncate) -> None:
        """Drop what the fold holds, at a truncate (a change): the summary keeps its
        position, and the lowest LSN is counted again from after it."""
        self.summary.truncate = [truncate.offset, truncate.lsn]
        self.summary.first_lsn = None
        self.states.clear()

    def _fold(self, raw: pa.RecordBatch) -> None:
        states, toast = self.states, self._toast_of
        lean = not self.follow_toast
        changes = self._decode(raw, headers_only=lean)
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
        most = self.plan.tuning.range_keys
        if len(states) > most:
            raise Unsupported(f"more than {most:,} keys in one partition's range")

    def _decode(self, raw: pa.RecordBatch, headers_only: bool = False) -> list:
        return self.schema.format.codec.decode_records(
            raw,
            self.schema,
            self._texts["key"],
            self._texts["value"],
            self._decoders,
            headers_only=headers_only,
        )

    def _log(self, raw: pa.RecordBatch) -> None:
        """A table without a key: the read batch's changes as rows (`changelog_rows`,
        which also replaces TOAST placeholders), for `drain`."""
        changes = self._decode(raw)
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
