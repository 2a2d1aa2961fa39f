"""The JSON-with-schema wire format (`WireFormat.JSON`, the `Codec` of
`cdclake.debezium.formats`): the reader splits each envelope into its schema and payload
text (`cdclake.kafka.raw_rows`); the raw rows -> changes (`Change`: key, rows after and before,
operation, source position), typed by msgspec where it can and decoded field by field
where it cannot (`decode_records`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import msgspec

from cdclake.debezium.connect import (
    ConnectField,
    parse_connect_schema,
)
from cdclake.debezium.formats import BadRecord, Change, settle
from cdclake.debezium.json_values import Source, row_decoder, typed_fields
from cdclake.debezium.schema import (
    Column,
    TopicSchema,
    value_row_fields,
)
from cdclake.kafka.raw_rows import OLD_KEY_HEADER, header_values
from cdclake.resolve.rules import (
    ROW_OPS,
    TRUNCATE,
    toastable,
)

if TYPE_CHECKING:
    import pyarrow as pa


class _Rows:
    """The rows of one Connect schema's payloads, typed by msgspec: a plain text,
    boolean, integer or double column is checked in C (`typed_fields`), the others are
    decoded after: those in `eager` at once (`finish`), the rest (`deferred`) only for
    the changes whose values are written (`settle`); `generic` decodes a row parsed as
    plain JSON field by field, which decides as always (`Unsupported`)."""

    def __init__(self, fields: Sequence[ConnectField], columns: Sequence[Column],
                 eager: Collection[str] | None = None) -> None:  # fmt: skip
        self.generic = row_decoder(fields, columns)
        self.later, self.deferred = [], []
        types, later = typed_fields(fields, columns)
        self.type = TypedDict("Row", types, total=False)  # type: ignore[misc]  # noqa: UP013
        for name, fn in later:
            now = eager is None or name in eager
            (self.later if now else self.deferred).append((name, fn))

    def finish(self, row: dict | None, deferred: bool = False) -> dict | None:
        """The row with its `eager` columns decoded (or its `deferred` ones)."""
        if row is not None:
            for name, fn in self.deferred if deferred else self.later:
                value = row.get(name)
                if value is not None:
                    row[name] = fn(value)
        return row

    def settle(self, change: Change) -> None:
        self.finish(change.after, deferred=True)
        self.finish(change.before, deferred=True)


class _Unparsed:
    """A value schema's rows kept as raw JSON (`msgspec.Raw`) by `decode_records`'
    headers-only decode, parsed and decoded whole (as `_Envelopes` would) when the
    change is settled."""

    __slots__ = ("rows", "typed")

    def __init__(self, rows: _Rows) -> None:
        self.rows = rows
        self.typed = msgspec.json.Decoder(rows.type).decode

    def settle(self, change: Change) -> None:
        change.after = self.row(change.after, change.partition, change.offset)
        change.before = self.row(change.before, change.partition, change.offset)

    def row(self, raw, partition: int, offset: int) -> dict | None:
        """One row (raw JSON, or None) of the record at `partition` and `offset`, decoded
        whole."""
        if raw is None:
            return None
        rows = self.rows
        try:
            row = self.typed(raw)
        except DECODE_ERRORS:  # decided field by field, as `_Envelopes.generic` does
            return rows.generic(parse_json(bytes(raw).decode()))
        rows.finish(row)
        return rows.finish(row, deferred=True)


class _Envelopes:
    """A value schema's envelopes: `typed` (msgspec) parses one straight into typed rows
    (`_Rows`) and a source of integer `ts_ms` and `lsn`; a payload it refuses (a value of
    another JSON type, NaN, ...) goes to `generic`, which parses it as plain JSON and
    decodes it field by field into (after, before, op, source ts_ms, source lsn, None)."""

    def __init__(self, fields: Sequence[ConnectField], columns: Sequence[Column],
                 eager: Collection[str] | None = None) -> None:  # fmt: skip
        self.rows = _Rows(fields, columns, eager)
        self.pending = self.rows if self.rows.deferred else None
        row = self.rows.type
        envelope = msgspec.defstruct("Envelope", [
            ("before", row | None, None), ("after", row | None, None),
            ("op", Any, None), ("source", Source | None, None),
        ])  # fmt: skip
        self.typed = msgspec.json.Decoder(envelope).decode
        # for `headers_only`: the rows are kept as raw JSON (`HEADER`), decoded by
        # `unparsed` when the change is settled
        self.unparsed = _Unparsed(self.rows)

    def generic(self, text: str, partition: int, offset: int):
        """An envelope `typed` refused (`decode_records` calls `typed` itself)."""
        envelope = parse_json(text)
        if not isinstance(envelope, dict):
            raise BadRecord("value is not a Debezium envelope matching its schema")
        source = envelope.get("source")
        if source is not None and not isinstance(source, dict):
            raise BadRecord("source is not a struct")
        source = source or {}
        for name in ("ts_ms", "lsn"):
            if source.get(name) is not None and type(source[name]) is not int:
                raise BadRecord(f"source.{name} is not an integer")
        generic = self.rows.generic
        return (generic(envelope.get("after")), generic(envelope.get("before")),
                envelope.get("op"), source.get("ts_ms"), source.get("lsn"), None)  # fmt: skip


class KeyRows:
    """A key schema's payloads -> rows (`_Rows`), else parsed as plain JSON and decoded
    field by field."""

    def __init__(self, fields: Sequence[ConnectField], columns: Sequence[Column]) -> None:
        self.rows = _Rows(fields, columns)
        self.typed = msgspec.json.Decoder(self.rows.type | None).decode

    def __call__(self, text: str | None, partition: int, offset: int):
        if text is not None:
            try:
                row = self.typed(text)
            except DECODE_ERRORS:
                pass
            else:
                return self.rows.finish(row) if self.rows.later else row
        return self.rows.generic(parse_json(text))


# ---- records ---------------------------------------------------------------------------


# msgspec's errors: a payload it refuses, or one not of the expected types
DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError)
_DECODE = msgspec.json.Decoder().decode  # 3× `json.loads` here
# an envelope's operation and source, its rows kept as raw JSON (a JSON null as NULL_ROW)
HEADER = msgspec.json.Decoder(msgspec.defstruct("Header", [
    ("before", msgspec.Raw, None), ("after", msgspec.Raw, None),
    ("op", Any, None), ("source", Source | None, None),
])).decode  # fmt: skip
NULL_ROW = msgspec.Raw(b"null")


def parse_json(text: str | None):
    if text is None:
        return None
    try:
        return _DECODE(text)
    except DECODE_ERRORS:
        pass  # e.g. NaN, which `json` takes as Jackson may write it
    try:
        return json.loads(text)
    except ValueError:
        raise BadRecord("the payload is not JSON") from None


def key_fields(text: str) -> tuple[ConnectField, ...]:
    """A key schema's fields (the key columns)."""
    return parse_connect_schema(text).fields


def value_fields(text: str, where: str) -> tuple[ConnectField, ...]:
    """A value schema's row fields: its envelope's `after` (DecodeError: no envelope)."""
    return value_row_fields(parse_connect_schema(text), where)


def row_decoders(schema: TopicSchema, key_schemas: Mapping[int, str],
                 value_schemas: Mapping[int, str]) -> tuple[dict, dict]:  # fmt: skip
    """The row decoders of each key and value schema (by id). A value's key and
    TOASTable columns are decoded at once, the others once the change is to be written
    (`settle`): a change that a later one replaces never needs them."""
    eager = {*schema.key_names, *(c.name for c in toastable(schema))}
    values = {
        sid: _Envelopes(value_fields(text, "value"), schema.columns, eager)  # fmt: skip
        for sid, text in value_schemas.items()
    }
    keys = {sid: KeyRows(key_fields(text), schema.key)
            for sid, text in key_schemas.items()}  # fmt: skip
    return keys, values


# the raw rows' columns a decode reads, in the order it takes them
RECORD_COLUMNS = ["partition", "offset", "is_tombstone", "key_schema_id", "key_payload",
                  "value_schema_id", "value_payload"]  # fmt: skip


def decode_records(
    rows: pa.Table | pa.RecordBatch,
    schema: TopicSchema,
    key_schemas: Mapping[int, str],
    value_schemas: Mapping[int, str],
    decoders: tuple[dict, dict] | None = None,
    headers_only: bool = False,
) -> list[Change]:
    """Raw rows of one topic (the reader's, without broken envelopes) -> changes, one per
    record; a record that cannot be applied raises `BadRecord`. `decoders` (from
    `row_decoders`) saves building them again for each call.

    `headers_only`: each record's key, operation and source are decoded and checked,
    but its rows are only parsed as far as to find their end and are decoded when the
    change is settled (`settle`): a change that a later one replaces never is, so a
    value that does not fit its column in such a change is never seen (as for the
    deferred columns). A fold that never reads a change's rows (no TOAST columns to
    follow) saves most of the decode this way."""
    keys, values = decoders or row_decoders(schema, key_schemas, value_schemas)
    cols = rows.select(RECORD_COLUMNS).to_pydict()
    ident = identifier(schema.key_names)
    changes: list[Change] = []
    append = changes.append
    sid = decode = typed = plain = rest = None
    unparsed = False  # the rows are kept raw (`headers_only`)
    for partition, offset, tombstone, key_sid, key_text, value_sid, value_text in zip(
        *(cols[c] for c in RECORD_COLUMNS), strict=True
    ):
        key = None if key_sid is None else decode_key(keys, key_sid, key_text, partition, offset)
        if value_sid is None:
            change = Change(partition, offset, bool(tombstone), key,
                             None, None, None, None, None, ident(key, None, None))  # fmt: skip
        else:
            if value_sid != sid:  # the envelopes' fast path, inlined (`_Envelopes`)
                decode = values.get(value_sid)
                if decode is None:
                    raise BadRecord(f"value schema "
                                      f"{value_sid} is not among the batch's")  # fmt: skip
                sid = value_sid
                unparsed = headers_only
                if unparsed:
                    typed, plain, rest = HEADER, True, decode.unparsed
                else:
                    typed, plain, rest = decode.typed, not decode.rows.later, decode.pending
            try:
                e = typed(value_text)
            except DECODE_ERRORS:
                e = None
            if e is not None:
                after, before, op, source = e.after, e.before, e.op, e.source
                if not plain:
                    after, before = decode.rows.finish(after), decode.rows.finish(before)
                ts = lsn = None
                if source is not None:
                    ts, lsn = source.get("ts_ms"), source.get("lsn")
                if unparsed:
                    after = None if after == NULL_ROW else after
                    before = None if before == NULL_ROW else before
                    change = Change(partition, offset, bool(tombstone), key, after, before,
                                     op, ts, lsn, ident(key, None, None), rest)  # fmt: skip
                    if None in change.ident:  # the key lacks a value: look in the rows
                        change.ident = ident(key, settle(change).after, change.before)
                else:
                    change = Change(partition, offset, bool(tombstone), key, after, before,
                                     op, ts, lsn, ident(key, after, before), rest)  # fmt: skip
            else:
                after, before, op, ts, lsn, pending = decode.generic(value_text, partition, offset)
                change = Change(partition, offset, bool(tombstone), key, after, before, op,
                                 ts, lsn, ident(key, after, before), pending)  # fmt: skip
        if not tombstone:
            check_change(change)
        append(change)
    if "headers" in rows.column_names and rows.column("headers").null_count < rows.num_rows:
        headers = [header_values(h) for h in rows.column("headers").to_pylist()]
        changed_from(changes, headers, cols["key_schema_id"], keys, ident)
    return changes


def decode_key(keys: Mapping, sid: int, text: str | None, partition: int, offset: int):
    decode = keys.get(sid)
    if decode is None:
        raise BadRecord(f"key schema {sid} is not among the batch's")
    return decode(text, partition, offset)


def check_change(change: Change) -> None:
    """A change event's operation is known, and it has a key (a truncate need not)."""
    op = change.op
    if op.__class__ is not str or op not in _OPS:
        raise BadRecord(f"unknown operation {op}")
    ident = change.ident
    if op != TRUNCATE and ident and ident.count(None) == len(ident):
        raise BadRecord("record has no key")


def changed_from(changes: list[Change], headers: list[dict[str, str]], key_sids: list,
                 keys: Mapping, ident) -> None:  # fmt: skip
    """Each create with an old key (the `__debezium.oldkey` header, in its record's
    `header_values`: a primary-key change) takes its values (`Change.from_key`), decoded
    as the record's own key is."""
    for change, found, sid in zip(changes, headers, key_sids, strict=True):
        text = found.get(OLD_KEY_HEADER)
        if text is None or change.op != "c" or keys.get(sid) is None:
            continue
        data = parse_json(text)
        if isinstance(data, dict) and "payload" in data and "schema" in data:
            data = data["payload"]  # the key as the JSON converter writes it
        if not isinstance(data, dict):
            raise BadRecord(f"header __debezium.oldkey is not a key: {text[:60]!r}")
        found = ident(keys[sid](json.dumps(data), change.partition, change.offset), None, None)
        change.from_key = None if None in found else found


_OPS = frozenset((*ROW_OPS, TRUNCATE))


def identifier(names: Sequence[str]) -> Callable[[dict | None, dict | None, dict | None], tuple]:
    """A function of a change's key, row after and row before to its key's values: each
    from the key, else from the row after, else from the row before."""
    if not names:
        return lambda key, after, before: ()
    from operator import itemgetter

    get = itemgetter(*names)
    one = len(names) == 1

    def ident(key, after, before) -> tuple:
        if key is not None:
            try:
                found = (get(key),) if one else get(key)
            except KeyError:  # a key field missing from the payload
                found = None
            if found is not None and None not in found:
                return found
        return tuple([_first_value(name, key, after, before) for name in names])

    return ident


def _first_value(name: str, *sides: dict | None):
    for side in sides:
        if side is not None and side.get(name) is not None:
            return side[name]
    return None
