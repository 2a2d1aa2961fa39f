"""Decode, check and resolve one topic's changes, in Python: the CDC rules written once.

`resolve_rows` takes raw records (the reader's Arrow rows) and gives the resolved rows the
MERGE reads: each key's latest change in Kafka order (`KeyFold`: the LSN re-send guard, a
tombstone following its delete, TOAST placeholders taking the key's last real value), or
for a table without a key every change (`changelog_rows`), after the last truncate.
It runs in the driver for a batch the driver read (`Tuning.driver_read_records`), and in Spark
tasks for a bigger one (`cdclake.resolve.tasks`), over all of a key's records of the batch.

A record that cannot be applied (its payload is not a Debezium envelope of its schema,
its operation is unknown, it has no key, a value does not fit its column) raises
`BadRecord` while decoding. The batch is then decoded again record by record, each
change's values whole, and each such record comes back in `TopicResolved.bad` with its
reason, to fail the table or go to the dead letters; the other records resolve as if it
were not there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdclake.debezium.formats import BadRecord, Change, by_column, settle
from cdclake.debezium.schema import (
    DELETED,
    LSN,
    OFFSET,
    OP,
    PARTITION,
    SOURCE_TS,
    Column,
    TopicSchema,
)
from cdclake.exceptions import DecodeError
from cdclake.resolve.rows import (
    columns_ddl,
    columns_table,
    cycles_uncollected,
    result_columns,
    rows_table,
    tally,
)
from cdclake.resolve.rules import (
    FROM_KEY_PREFIX,
    HAS_VALUES,
    STALE_CHECK_LSN,
    TOAST_PLACEHOLDER,
    TOAST_PREFIX,
    TRUNCATE,
    Truncate,
    toastable,
)

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class TopicResolved:
    """What the checks and the resolve of one topic's records found."""

    rows: pa.Table  # of `result_columns`
    ddl: str  # the rows' Spark schema
    truncate: Truncate | None
    counts: dict[bool, int]  # rows per deleted flag
    max_source_ms: int | None  # the latest source timestamp of the rows
    toast: bool  # the rows carry the TOAST flags (a placeholder was left for the table)
    # records that cannot be applied: (partition, offset, reason), in Kafka order
    bad: tuple[tuple[int, int, str], ...] = ()


# ---- resolve ---------------------------------------------------------------------------


# a TOAST placeholder as a value of each type `toastable` columns have (`is_placeholder`)
_PLACEHOLDERS = {"string": TOAST_PLACEHOLDER, "binary": TOAST_PLACEHOLDER.encode(),
                 "array<string>": [TOAST_PLACEHOLDER]}  # fmt: skip


class ToastColumns:
    """The `toastable` columns as `KeyFold.add` reads them: (name, placeholder) pairs,
    and a getter of all their values of a row at once."""

    __slots__ = ("pairs", "values", "all_real")

    def __init__(self, columns: Sequence[Column]) -> None:
        from operator import itemgetter

        self.pairs = tuple((c.name, _PLACEHOLDERS[c.type]) for c in columns)
        names = [n for n, _ in self.pairs]
        get = itemgetter(*names) if names else None
        self.values = (lambda row: (get(row),)) if len(names) == 1 else get
        marks = tuple({repr(p): p for _, p in self.pairs}.values())
        if len(marks) == 1:  # one type of TOAST column (most tables)
            mark = marks[0]
            self.all_real = lambda values: None not in values and mark not in values
        else:
            self.all_real = lambda values: (
                None not in values and not any(m in values for m in marks)
            )

    def __bool__(self) -> bool:
        return bool(self.pairs)


NO_TOAST = ToastColumns(())


def placeholder_of(column: Column):
    """A TOAST placeholder as a value of the column's type (None: it holds none)."""
    return _PLACEHOLDERS.get(column.type)


def is_placeholder(value, column: Column) -> bool:
    """`toast_test`, with NULL as False (columns of other types hold no placeholder)."""
    return value is not None and value == _PLACEHOLDERS.get(column.type)


def last_truncate(changes: Sequence[Change]) -> Truncate | None:
    """The truncate with the highest offset."""
    found = [c for c in changes if not c.is_tombstone and c.op == TRUNCATE]
    if not found:
        return None
    last = max(found, key=lambda c: (c.offset, c.partition))
    return Truncate(last.partition, last.offset, last.lsn)


def _after_truncate(changes: Sequence[Change], truncate: Truncate | None) -> list[Change]:
    rows = [c for c in changes if c.op != TRUNCATE]
    if truncate is None:
        return rows

    def kept(c: Change) -> bool:
        if c.partition == truncate.partition:
            return c.offset > truncate.offset
        return truncate.lsn is None or c.lsn is None or c.lsn > truncate.lsn

    return [c for c in rows if kept(c)]


_SCALAR_KEYS = ("int", "bigint", "float", "double", "string", "binary", "boolean", "date",
                "timestamp", "timestamp_ntz")  # fmt: skip


def check_key_types(schema: TopicSchema) -> None:
    """A key column is a plain value (not an array, a map or a struct)."""
    for k in schema.key:
        if k.type not in _SCALAR_KEYS and not k.type.startswith("decimal("):
            raise DecodeError(
                f"key column {k.name!r} is {k.type}: a key column must hold "
                "plain values; set the table's `key` to other columns"
            )


def resolve_changes(
    changes: Sequence[Change], schema: TopicSchema
) -> tuple[list[dict], Truncate | None, bool]:
    """Each key's resolved row (dicts of `result_columns`), the truncate, and whether the
    rows carry the TOAST flags (a placeholder was left for the table's value)."""
    check_key_types(schema)
    truncate = last_truncate(changes)
    toasty = toastable(schema)
    rows = []
    for c in _after_truncate(changes, truncate):
        key = c.ident
        if c.is_tombstone and all(v is None for v in key):
            continue  # a tombstone without key carries nothing
        rows.append((key, c))
    groups: dict[tuple, list[Change]] = {}
    for key, c in sorted(rows, key=lambda kc: (kc[1].partition, kc[1].offset)):
        groups.setdefault(key, []).append(c)
    found = any(is_placeholder(c.after.get(col.name), col)
                for _, c in rows if c.after is not None for col in toasty)  # fmt: skip
    toast_of = ToastColumns(toasty if found else [])
    out, shape = [], RowShape(schema, toast_of)
    for key, group in groups.items():
        fold = KeyFold()
        for c in group:
            fold.add(c, toast_of)
        if fold.r is not None:
            out.append(fold.row(key, shape))
    return out, truncate, any(row[flag] for row in out for *_, flag in shape.toast)


class KeyFold:
    """One key's changes folded in Kafka order into what its resolved row needs: a change
    whose LSN is not above every earlier one's is a re-send and is dropped, a tombstone
    goes with the change before it, and the latest change kept gives the row. Holds one
    key's latest state, not its changes."""

    __slots__ = ("seen", "prev_stale", "r", "lsn", "change", "after", "real", "base", "from_key")

    def __init__(self) -> None:
        self.seen: int | None = None  # the highest LSN of the key's changes so far
        self.prev_stale = True  # a first tombstone follows nothing and is dropped
        self.r: Change | None = None  # the kept change with the highest offset
        self.lsn: int | None = None  # the highest LSN of the kept changes
        self.change: Change | None = None  # the kept change (not tombstone), highest offset
        self.after: Change | None = None  # the kept change with a row, highest offset
        # the last real value of each TOAST column: the one of highest offset among
        # `real` (column -> (offset, value)) and `base`, the kept change of highest
        # offset whose every TOAST column held a real value (most changes)
        self.real: dict[str, tuple[int, Any]] = {}
        self.base: Change | None = None
        # the key this one was changed from by its last create (a primary-key change)
        self.from_key: tuple | None = None

    def add(self, c: Change, toast: ToastColumns = NO_TOAST) -> None:
        """The next change of the key (Kafka order); `toast`: the columns whose last
        real value a TOAST placeholder takes."""
        stale = c.lsn is not None and self.seen is not None and c.lsn <= self.seen
        dropped = self.prev_stale if c.is_tombstone else stale
        self.prev_stale = stale
        if c.lsn is not None and (self.seen is None or c.lsn > self.seen):
            self.seen = c.lsn
        if dropped:
            return
        # `max` by offset keeps the first of equal offsets (of different partitions)
        if self.r is None or c.offset > self.r.offset:
            self.r = c
        if c.lsn is not None and (self.lsn is None or c.lsn > self.lsn):
            self.lsn = c.lsn
        if not c.is_tombstone and (self.change is None or c.offset > self.change.offset):
            self.change = c
        if c.op == "c":  # a new row of the key: no value of its earlier one carries over
            self.real, self.base, self.from_key = {}, None, c.from_key
        after = c.after
        if after is None:
            return
        if self.after is None or c.offset > self.after.offset:
            self.after = c
            if not toast:
                return
            try:
                values = toast.values(after)
            except KeyError:  # a column the row does not have
                values = None
            if values is not None and toast.all_real(values):
                # every column's value is real, of the highest offset yet: it is each
                # column's last real value
                self.base = c
                if self.real:
                    self.real = {}
                return
        real, offset, base = self.real, c.offset, self.base
        for name, placeholder in toast.pairs:
            value = after.get(name)
            if value is not None and value != placeholder:
                held = real.get(name)
                top = -1 if held is None else held[0]
                if base is not None and base.offset > top:
                    top = base.offset
                if offset > top:
                    real[name] = (offset, value)

    def _real(self, name: str):
        """The last real value of a TOAST column, as (offset, value), or None."""
        held, base = self.real.get(name), self.base
        if base is not None and (held is None or base.offset > held[0]):
            return base.offset, base.after[name]
        return held

    def values(self) -> dict | None:
        """The row the key's resolved values come from (decoded whole): the kept change's
        row after, or for a deleted key the last kept row after, else its delete's row
        before (all its columns with `REPLICA IDENTITY FULL`, the key's alone by default;
        `meta` says the row has no values, so a MERGE keeps the table's, and only a key
        the lake does not hold takes them)."""
        r = self.r
        assert r is not None, "no change of the key was kept"
        if r.is_tombstone or r.op == "d":
            if self.after is not None:
                return settle(self.after).after
            delete = self.change  # a tombstone's is the delete before it
            return None if delete is None or delete.op != "d" else settle(delete).before
        return settle(r).after

    def meta(self) -> tuple:
        """The resolved row's `META` columns."""
        r = self.r
        if r.is_tombstone:
            # a re-sent delete must not remove a newer row: a tombstone is checked with
            # the LSN of its delete
            stale = None if self.change is None else self.change.lsn
        else:
            stale = r.lsn
        deleted = r.is_tombstone or r.op == "d"
        # a tombstone's row is described by its delete, when the batch holds it
        at = self.change if r.is_tombstone and self.change is not None else r
        return (deleted, "d" if r.is_tombstone else r.op,
                None if at.source_ts_ms is None else at.source_ts_ms * 1000,
                r.lsn if r.lsn is not None else self.lsn, stale,
                not deleted or self.after is not None, at.partition, at.offset)  # fmt: skip

    def row(self, key: tuple, shape: RowShape) -> dict:
        """The key's resolved row (`result_columns`), with the TOAST flags of the shape's
        columns (those `add` was given) and, when one is set, the key it was changed from
        (whose value a flagged column takes, not the table's)."""
        after = self.values()
        if after is None:
            row = dict.fromkeys(shape.names)
        else:
            row = {name: after.get(name) for name in shape.names}
        row.update(zip(shape.key_names, key, strict=True))
        row.update(zip(META, self.meta(), strict=True))
        left = False  # a TOAST column left to the table
        for name, mark, flag in shape.toast:  # `toastable` columns: never a key column
            # a deleted key's row (written with soft deletes) takes the value too; the
            # flag tells the MERGE to keep the table's value
            placeholder = row[name] is not None and row[name] == mark
            held = self._real(name) if placeholder else None
            unresolved = placeholder and held is None
            if unresolved:
                row[name] = None
            elif placeholder:
                row[name] = held[1]
            row[flag] = unresolved
            left = left or unresolved
        if shape.toast:
            from_key = self.from_key if left else None
            row.update(zip(shape.from_names, from_key or shape.no_key, strict=True))
        return row


# the columns of a resolved row after the table's, as `KeyFold.meta` gives them
META = (DELETED, OP, SOURCE_TS, LSN, STALE_CHECK_LSN, HAS_VALUES, PARTITION, OFFSET)


def folds_table(folds: Sequence[tuple[tuple, KeyFold]], shape: RowShape,
                columns: Sequence[tuple[str, str]]) -> pa.Table:  # fmt: skip
    """The resolved rows of (key, fold) pairs as `rows_table` makes them of their
    `KeyFold.row`s, built column by column; for a shape without TOAST flags."""
    assert not shape.toast, "the TOAST flags take `KeyFold.row`"
    data = by_column([fold.values() for _, fold in folds], shape.names)
    for i, name in enumerate(shape.key_names):
        data[name] = [key[i] for key, _ in folds]
    metas = [fold.meta() for _, fold in folds]
    for i, name in enumerate(META):
        data[name] = [m[i] for m in metas]
    return columns_table(data, columns)


class RowShape:
    """What `KeyFold.row` writes: the schema's columns, its key, and the TOAST columns
    whose flags it carries (name, placeholder, flag column), with the key it was changed
    from (`from_names`)."""

    __slots__ = ("names", "key_names", "toast", "from_names", "no_key")

    def __init__(self, schema: TopicSchema, toast: ToastColumns = NO_TOAST) -> None:
        self.names = tuple(c.name for c in schema.columns)
        self.key_names = schema.key_names
        self.toast = tuple((name, mark, f"{TOAST_PREFIX}{name}") for name, mark in toast.pairs)
        self.from_names = tuple(f"{FROM_KEY_PREFIX}{k}" for k in self.key_names)
        self.no_key = (None,) * len(self.key_names)


def changelog_rows(changes: Sequence[Change], schema: TopicSchema) -> list[dict]:
    """The rows of a table without a key: every change."""
    out = []
    for c in changes:
        if c.is_tombstone:
            continue
        settle(c)
        deleted = c.op == "d"
        data = c.before if deleted else (c.after if c.op != TRUNCATE else None)
        row: dict[str, Any] = {}
        for col in schema.columns:
            value = None if data is None else data.get(col.name)
            if is_placeholder(value, col):
                value = None if c.before is None else c.before.get(col.name)
            row[col.name] = value
        row[DELETED] = deleted
        row[OP] = c.op
        row[SOURCE_TS] = None if c.source_ts_ms is None else c.source_ts_ms * 1000
        row[LSN] = c.lsn
        row[PARTITION] = c.partition
        row[OFFSET] = c.offset
        out.append(row)
    return out


def resolve_rows(
    rows: pa.Table,
    schema: TopicSchema,
    key_schemas: Mapping[int, str],
    value_schemas: Mapping[int, str],
) -> TopicResolved:
    """Raw rows of one topic -> the resolved rows, what the checks found and the records
    that cannot be applied."""
    keyed = bool(schema.key_names)
    check_key_types(schema)
    bad: list[tuple[int, int, str]] = []
    with cycles_uncollected():
        try:
            codec = schema.format.codec
            changes = codec.decode_records(rows, schema, key_schemas, value_schemas)
            out, truncate, toast = _resolve(changes, schema)
        except BadRecord:  # find each record that cannot be applied, and leave it out
            changes = decode_each(rows, schema, key_schemas, value_schemas, bad)
            out, truncate, toast = _resolve(changes, schema)
    columns = result_columns(schema, keyed, toast)
    table = rows_table(out, columns)
    counts: dict[bool, int] = {}
    latest_ms = tally(table, counts, None)
    return TopicResolved(table, columns_ddl(columns), truncate, counts, latest_ms, toast,
                          tuple(bad))  # fmt: skip


def _resolve(changes: list[Change], schema: TopicSchema):
    if schema.key_names:
        return resolve_changes(changes, schema)
    return changelog_rows(changes, schema), None, False


def decode_each(rows: pa.Table, schema: TopicSchema, key_schemas: Mapping[int, str],
                value_schemas: Mapping[int, str], bad: list) -> list[Change]:  # fmt: skip
    """The changes of the records that can be applied, each decoded alone and whole;
    each other record's (partition, offset, reason) is appended to `bad`."""
    codec = schema.format.codec
    decoders = codec.row_decoders(schema, key_schemas, value_schemas)
    changes = []
    for i in range(rows.num_rows):
        one = rows.slice(i, 1)
        try:
            [change] = codec.decode_records(one, schema, key_schemas, value_schemas, decoders)
            changes.append(settle(change))
        except BadRecord as why:
            bad.append((one["partition"][0].as_py(), one["offset"][0].as_py(), str(why)))
    return changes
