"""Decode, check and resolve one topic's changes, in Python: the CDC rules written once.

`resolve_rows` takes raw records (the reader's Arrow rows) and gives the resolved rows the
MERGE reads: each key's latest change in Kafka order (`KeyFold`: the LSN re-send guard, a
tombstone following its delete, TOAST placeholders taking the key's last real value), or
for a table without a key every change (`changelog_rows`), after the last truncate.
It runs in the driver for a batch the driver read (`DRIVER_READ_RECORDS`), and in Spark
tasks for a bigger one (`resolve_task`), over all of a key's records of the batch.

A record that cannot be applied (its payload is not a Debezium envelope of its schema,
its operation is unknown, it has no key, a value does not fit its column) raises
`BadRecord` while decoding. The batch is then decoded again record by record, each
change's values whole, and each such record comes back in `DriverResolved.bad` with its
reason, to fail the table or go to the dead letters; the other records resolve as if it
were not there.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import math
import struct
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypedDict

from cdclake.changes import (
    DELETED,
    LSN,
    OFFSET,
    OP,
    PARTITION,
    SOURCE_TS,
    Column,
    TopicSchema,
    value_row_fields,
)
from cdclake.debezium import (
    CONNECT_DATE,
    CONNECT_TIME,
    CONNECT_TIMESTAMP,
    DATE,
    DECIMAL,
    GEOGRAPHY,
    GEOMETRY,
    INFINITY_DAYS,
    INFINITY_MICROS,
    INFINITY_MILLIS,
    MICRO_TIME,
    MICRO_TIMESTAMP,
    NANO_TIME,
    NANO_TIMESTAMP,
    TIME,
    TIMESTAMP,
    VARIABLE_SCALE_DECIMAL,
    ZONED_TIMESTAMP,
    ConnectField,
    decimal_params,
    parse_connect_schema,
)
from cdclake.exceptions import DecodeError
from cdclake.resolve import (
    HAS_VALUES,
    ROW_OPS,
    STALE_CHECK_LSN,
    TOAST_PLACEHOLDER,
    TOAST_PREFIX,
    TRUNCATE,
    Truncate,
    toastable,
)

if TYPE_CHECKING:
    import pyarrow as pa


class Unsupported(Exception):
    """What a fold cannot take (the message says why)."""


class BadRecord(Unsupported):
    """A record that cannot be applied (the message says why)."""


@dataclass(frozen=True)
class DriverResolved:
    """What the checks and the resolve of one topic's records found."""

    rows: pa.Table  # the shape of `resolve_latest` / `changelog`
    ddl: str  # the rows' Spark schema
    truncate: Truncate | None
    counts: dict[bool, int]  # rows per deleted flag
    max_source_ms: int | None  # the latest source timestamp of the rows
    toast: bool  # the rows carry the TOAST flags (a placeholder was in the batch)
    # records that cannot be applied: (partition, offset, reason), in Kafka order
    bad: tuple[tuple[int, int, str], ...] = ()


# ---- values ----------------------------------------------------------------------------

_EPOCH_DAY = dt.date(1970, 1, 1).toordinal()
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICRO = dt.timedelta(microseconds=1)
# the ends of the range Spark and Iceberg share, which ±infinity loads as (debezium.py)
_MAX_DAY = dt.date(9999, 12, 31).toordinal() - _EPOCH_DAY
_MIN_DAY = dt.date(1, 1, 1).toordinal() - _EPOCH_DAY
_MAX_MICROS = (dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC) - _EPOCH) // _MICRO
_MIN_MICROS = (dt.datetime(1, 1, 1, tzinfo=dt.UTC) - _EPOCH) // _MICRO
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_FLOAT_TEXTS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _integer(value, field: ConnectField, bounds: tuple[int, int]) -> int:
    if type(value) is not int or not bounds[0] <= value <= bounds[1]:
        raise BadRecord(f"field {field.name!r}: {value!r} is not a {field.type}")
    return value


def _number(value, field: ConnectField) -> float:
    if isinstance(value, str) and value in _FLOAT_TEXTS:
        return _FLOAT_TEXTS[value]
    if type(value) not in (int, float):
        raise BadRecord(f"field {field.name!r}: {value!r} is not a number")
    return float(value)


def _float32(value: float) -> float:
    """The value a float column holds (Spark parses JSON into a 32-bit float)."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except (OverflowError, struct.error):
        raise BadRecord(f"{value!r} is out of a 32-bit float's range") from None


def _unbase64(value, field: ConnectField) -> bytes:
    if not isinstance(value, str):
        raise BadRecord(f"field {field.name!r}: {value!r} is not base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadRecord(f"field {field.name!r}: {value[:40]!r} is not base64") from None


def _time_text(micros: int) -> str:
    """Microseconds since midnight -> 'HH:MM:SS.ffffff' ."""
    if not 0 <= micros < 100 * 3_600_000_000:
        raise BadRecord(f"time of day {micros} µs is out of range")
    seconds, frac = divmod(micros, 1_000_000)
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{frac:06d}"


def _ranged(value: int, low: int, high: int, what: str) -> int:
    if not low <= value <= high:
        raise BadRecord(f"{what} {value} is out of the lake's range")
    return value


def _decimal(field: ConnectField) -> Callable[[Any], Any]:
    precision, _ = decimal_params(field)
    raw_scale = int(field.param("scale", "0") or 0)
    limit = 10**precision  # on the digits of the lake's unscaled value

    def decode(value):
        # integers only: Decimal arithmetic rounds to 28 digits
        unscaled = int.from_bytes(_unbase64(value, field), "big", signed=True)
        if raw_scale < 0:
            unscaled *= 10**-raw_scale
        if abs(unscaled) >= limit:  # Spark makes it NULL: a value that does not fit
            raise BadRecord(f"field {field.name!r}: {unscaled}E{-max(raw_scale, 0)} does not "
                              "fit its decimal type")  # fmt: skip
        return Decimal(f"{unscaled}E{-max(raw_scale, 0)}")

    return decode


def _variable_scale(field: ConnectField) -> Callable[[Any], Any]:
    def decode(value):
        if not isinstance(value, dict):
            raise BadRecord(f"field {field.name!r}: {value!r} is not a variable-scale decimal")
        scale, digits64 = value.get("scale"), value.get("value")
        if digits64 is None:
            return None
        scale = _integer(scale, field, _INT32)
        unscaled = int.from_bytes(_unbase64(digits64, field), "big", signed=True)
        digits = str(abs(unscaled)).rjust(scale + 1, "0")
        sign = "-" if unscaled < 0 else ""
        cut = len(digits) - scale
        return sign + (digits[:cut] + "." + digits[cut:] if scale > 0 else digits)

    return decode


def _zoned(field: ConnectField) -> Callable[[Any], Any]:
    def decode(value):
        if value == "infinity":
            return _MAX_MICROS
        if value == "-infinity":
            return _MIN_MICROS
        if not isinstance(value, str):
            raise BadRecord(f"field {field.name!r}: {value!r} is not a zoned timestamp")
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            raise BadRecord(f"field {field.name!r}: {value!r} is not a timestamp") from None
        if parsed.tzinfo is None:
            raise BadRecord(f"field {field.name!r}: {value!r} has no time zone")
        return (parsed - _EPOCH) // _MICRO

    return decode


def _infinity(values: tuple[int, int], top: int, bottom: int, scale: int, field: ConnectField):
    def decode(value):
        value = _integer(value, field, _INT64)
        if value == values[0]:
            return top
        if value == values[1]:
            return bottom
        return _ranged(value * scale, bottom, top, f"field {field.name!r}:")

    return decode


def decoder(field: ConnectField) -> Callable[[Any], Any]:
    """A function from the JSON value of `field` (not None) to the value of its lake type
    as Arrow takes it (dates as days, timestamps as microseconds); `BadRecord` for a value
    that does not fit."""
    lg = field.logical
    if lg == DECIMAL:
        return _decimal(field)
    if lg in (DATE, CONNECT_DATE):
        return _infinity(INFINITY_DAYS, _MAX_DAY, _MIN_DAY, 1, field)
    if lg in (TIMESTAMP, CONNECT_TIMESTAMP):
        return _infinity(INFINITY_MILLIS, _MAX_MICROS, _MIN_MICROS, 1000, field)
    if lg == MICRO_TIMESTAMP:
        return _infinity(INFINITY_MICROS, _MAX_MICROS, _MIN_MICROS, 1, field)
    if lg == NANO_TIMESTAMP:
        return lambda v: _ranged(_integer(v, field, _INT64) // 1000, _MIN_MICROS, _MAX_MICROS,
                                 f"field {field.name!r}:")  # fmt: skip
    if lg == ZONED_TIMESTAMP:
        return _zoned(field)
    if lg in (TIME, CONNECT_TIME):
        return lambda v: _time_text(_integer(v, field, _INT64) * 1000)
    if lg == MICRO_TIME:
        return lambda v: _time_text(_integer(v, field, _INT64))
    if lg == NANO_TIME:
        return lambda v: _time_text(_integer(v, field, _INT64) // 1000)
    if lg == VARIABLE_SCALE_DECIMAL:
        return _variable_scale(field)
    if lg in (GEOMETRY, GEOGRAPHY):

        def geo(value):
            if not isinstance(value, dict):
                raise BadRecord(f"field {field.name!r}: {value!r} is not a geometry")
            wkb, srid = value.get("wkb"), value.get("srid")
            return {"wkb": None if wkb is None else _unbase64(wkb, field),
                    "srid": None if srid is None else _integer(srid, field, _INT32)}  # fmt: skip

        return geo
    kind = field.type
    if kind == "bytes":
        return lambda v: _unbase64(v, field)
    if kind in ("int8", "int16", "int32"):
        return lambda v: _integer(v, field, _INT32)
    if kind == "int64":
        return lambda v: _integer(v, field, _INT64)
    if kind in ("float32", "float"):
        return lambda v: _float32(_number(v, field))
    if kind in ("float64", "double"):
        return lambda v: _number(v, field)
    if kind == "boolean":
        return _checked(field, bool, "a boolean")
    if kind == "string":
        return _checked(field, str, "text")
    if kind == "array" and field.items is not None:
        item = decoder(field.items)
        return _checked(field, list, "an array",
                        lambda v: [None if x is None else item(x) for x in v])  # fmt: skip
    if kind == "map" and field.values is not None:
        member = decoder(field.values)
        return _checked(field, dict, "a map", lambda v: [
            (k, None if x is None else member(x)) for k, x in v.items()
        ])  # fmt: skip
    if kind == "struct":  # kept as JSON text (a point's x, y, wkb, srid)
        return lambda v: _json_text(v, field)
    raise DecodeError(f"field {field.name!r}: Connect type {kind} has no lake type")


class _Slow(Exception):
    """A column that `column_decoder` leaves to `decoder`, value by value."""


# a ZonedTimestamp's text as Debezium writes it (UTC, `Z`), or with an offset, of a year
# from 1; what else Arrow parses (a year 0, another separator) is decoded value by value
_ZONED_TEXT = (r"^([0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)-[0-9]{2}-[0-9]{2}"
               r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?"
               r"(Z|[+-][0-9]{2}:[0-9]{2})$")  # fmt: skip


def column_decoder(field: ConnectField, kind: pa.DataType) -> Callable[[list], pa.Array] | None:
    """A decoder of a whole column of `field`'s JSON values (None for null) into an
    Arrow array of `kind` (the lake column's), for the types whose value-by-value decode
    (`decoder`) is the costly part of a row's: decimals of up to 18 digits, dates and
    timestamps. It gives what `decoder` gives for each value, or raises `_Slow` for the
    column to be decoded value by value (which decides as always: `Unsupported`). None:
    the field's type has no such decoder."""
    import pyarrow as pa

    lg = field.logical
    if lg == DECIMAL:
        precision, scale = decimal_params(field)
        if precision > 18 or kind != pa.decimal128(precision, scale):
            return None
        return _decimal_column(field, kind)
    if lg in (DATE, CONNECT_DATE) and kind == pa.date32():
        return _infinity_column(INFINITY_DAYS, _MAX_DAY, _MIN_DAY, 1, pa.int32(), kind)
    if not pa.types.is_timestamp(kind) or kind.unit != "us":
        return None
    if lg in (TIMESTAMP, CONNECT_TIMESTAMP):
        return _infinity_column(INFINITY_MILLIS, _MAX_MICROS, _MIN_MICROS, 1000, pa.int64(),
                                kind)  # fmt: skip
    if lg == MICRO_TIMESTAMP:
        return _infinity_column(INFINITY_MICROS, _MAX_MICROS, _MIN_MICROS, 1, pa.int64(), kind)
    if lg == ZONED_TIMESTAMP and kind.tz is not None:
        return _zoned_column(kind)
    return None


def _nulls(values: list):
    import numpy as np

    return np.fromiter((v is None for v in values), dtype=bool, count=len(values))


def _decimal_column(field: ConnectField, kind: pa.DataType) -> Callable[[list], pa.Array]:
    import numpy as np
    import pyarrow as pa

    raw_scale = int(field.param("scale", "0") or 0)
    factor = 10**-raw_scale if raw_scale < 0 else 1
    limit = 10**kind.precision
    unbase64, from_bytes = base64.b64decode, int.from_bytes

    def decode(values: list) -> pa.Array:
        try:
            unscaled = [0 if v is None else from_bytes(unbase64(v, validate=True), "big",
                                                       signed=True) * factor
                        for v in values]  # fmt: skip
        except (TypeError, ValueError, binascii.Error):  # not base64 text
            raise _Slow from None
        if unscaled and max(map(abs, unscaled)) >= limit:
            raise _Slow
        ints = pa.array(np.array(unscaled, dtype=np.int64), mask=_nulls(values))
        # the unscaled values as decimals of scale 0, read with the column's scale
        return ints.cast(pa.decimal128(19, 0)).view(kind)

    return decode


def _infinity_column(
    values: tuple[int, int],
    top: int,
    bottom: int,
    scale: int,
    width: pa.DataType,
    kind: pa.DataType,
) -> Callable[[list], pa.Array]:
    """Dates or timestamps of whole numbers, ±infinity loaded as the ends (`_infinity`)."""
    import numpy as np
    import pyarrow as pa

    low, high = -(-bottom // scale), top // scale  # the values that fit once scaled

    def decode(column: list) -> pa.Array:
        if set(map(type, column)) - {int, type(None)}:
            raise _Slow
        nulls = _nulls(column)
        try:
            ints = np.array([0 if v is None else v for v in column], dtype=np.int64)
        except OverflowError:
            raise _Slow from None
        ends = (ints == values[0]) | (ints == values[1])
        if np.any(~ends & ((ints < low) | (ints > high))):
            raise _Slow
        out = np.where(ints == values[0], top,
                       np.where(ints == values[1], bottom, ints * scale))  # fmt: skip
        return pa.array(out.astype(width.to_pandas_dtype()), type=width, mask=nulls).view(kind)

    return decode


def _zoned_column(kind: pa.DataType) -> Callable[[list], pa.Array]:
    import pyarrow as pa
    import pyarrow.compute as pc

    def decode(values: list) -> pa.Array:
        try:
            texts = pa.array(values, type=pa.string())
        except (pa.ArrowException, TypeError):
            raise _Slow from None
        if texts.null_count < len(texts) and not pc.all(
            pc.match_substring_regex(texts, _ZONED_TEXT)
        ).as_py():  # fmt: skip
            raise _Slow
        try:
            return texts.cast(kind)
        except pa.ArrowException:
            raise _Slow from None

    return decode


def _checked(field: ConnectField, kind: type, what: str, convert=None) -> Callable[[Any], Any]:
    """A decoder of JSON values of one Python type (`convert`ed, when given)."""

    def decode(value):
        if not isinstance(value, kind):
            raise BadRecord(f"field {field.name!r}: {value!r:.60} is not {what}")
        return value if convert is None else convert(value)

    return decode


def _json_text(value, field: ConnectField) -> str:
    """JSON text as Spark's `from_json` writes a nested value it reads as a string:
    Jackson's compact generator, doubles as Java's `Double.toString`."""
    if isinstance(value, dict):
        items = (f"{_json_string(k)}:{_json_text(v, field)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_json_text(v, field) for v in value) + "]"
    if isinstance(value, str):
        return _json_string(value)
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return str(value)
    return _java_double(value, field)


def _json_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # escapes what Jackson escapes


def _java_double(value: float, field: ConnectField) -> str:
    if not math.isfinite(value):
        raise BadRecord(f"field {field.name!r}: {value} in a nested value")
    if value == 0:
        return "-0.0" if math.copysign(1, value) < 0 else "0.0"
    if 1e-3 <= abs(value) < 1e7:
        return repr(value)  # plain digits with a point, as Java writes them in this range
    sign, digits, exponent = Decimal(repr(value)).as_tuple()
    text = "".join(map(str, digits)).rstrip("0") or "0"
    power = exponent + len(digits) - 1
    return f"{'-' if sign else ''}{text[0]}.{text[1:] or '0'}E{power}"


def _row_decoder(fields: Sequence[ConnectField], columns: Sequence[Column]):
    """A function from a parsed row (dict, or None) to a dict of every unified column."""
    by_name = {f.name: f for f in fields}
    plan = [(c.name, decoder(by_name[c.name]) if c.name in by_name else None) for c in columns]

    def decode(parsed):
        if parsed is None:
            return None
        if not isinstance(parsed, dict):
            raise BadRecord(f"{parsed!r:.60} is not a row")
        row = {}
        for name, fn in plan:
            value = parsed.get(name) if fn is not None else None
            row[name] = None if value is None else fn(value)
        return row

    return decode


_INT_TYPES = {"int8": _INT32, "int16": _INT32, "int32": _INT32, "int64": _INT64}


def _typed_fields(fields: Sequence[ConnectField], columns: Sequence[Column]):
    """msgspec types of a row's fields, and the decoders of those it only parses: a
    plain text, boolean, integer or double column is type-checked by msgspec as its
    decoder would check it; any other is parsed as JSON and then decoded."""
    from typing import Annotated

    from msgspec import Meta

    wanted = {c.name for c in columns}
    types, later = {}, []
    for f in fields:
        if f.name not in wanted:
            continue
        kind = f.type if f.logical is None else None
        if kind == "string":
            types[f.name] = str | None
        elif kind == "boolean":
            types[f.name] = bool | None
        elif kind in _INT_TYPES:
            low, high = _INT_TYPES[kind]
            types[f.name] = Annotated[int, Meta(ge=low, le=high)] | None
        elif kind in ("float64", "double"):
            types[f.name] = float | None
        else:
            types[f.name] = Any
            later.append((f.name, decoder(f)))
    return types, later


# an envelope's source as the resolve reads it: other fields are skipped unparsed
_Source = TypedDict("_Source", {"ts_ms": int | None, "lsn": int | None}, total=False)  # noqa: UP013


class _Rows:
    """The rows of one Connect schema's payloads, typed by msgspec: a plain text,
    boolean, integer or double column is checked in C (`_typed_fields`), the others are
    decoded after: those in `eager` at once (`finish`), the rest (`deferred`) only for
    the changes whose values are written (`settle`); `generic` decodes a row parsed as
    plain JSON field by field, which decides as always (`Unsupported`)."""

    def __init__(self, fields: Sequence[ConnectField], columns: Sequence[Column],
                 eager: Collection[str] | None = None) -> None:  # fmt: skip
        self.generic = _row_decoder(fields, columns)
        self.fields = {f.name: f for f in fields}
        self.later, self.deferred, self.type = [], [], None
        if _DECODE is not None:
            types, later = _typed_fields(fields, columns)
            self.type = TypedDict("Row", types, total=False)  # type: ignore[misc]  # noqa: UP013
            self.types = types
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

    def settle(self, change: _Change) -> None:
        self.finish(change.after, deferred=True)
        self.finish(change.before, deferred=True)


class _Unparsed:
    """A value schema's rows kept as raw JSON (`msgspec.Raw`) by `decode_records`'
    headers-only decode, parsed and decoded whole (as `_Envelopes` would) when the
    change is settled."""

    __slots__ = ("column_decoders", "parse", "rows", "struct", "typed")

    def __init__(self, rows: _Rows) -> None:
        self.rows = rows
        self.typed = self.struct = self.parse = None  # built when first needed
        # (column name, lake type) -> (its value decoder, its `column_decoder` or None),
        # for the columns whose values need converting
        self.column_decoders: dict[tuple[str, str], tuple[Callable | None, Callable | None]] = {}

    def settle(self, change: _Change) -> None:
        change.after = self.row(change.after, change.partition, change.offset)
        change.before = self.row(change.before, change.partition, change.offset)

    def _typed(self):
        if self.typed is None:
            from msgspec.json import Decoder

            self.typed = Decoder(self.rows.type).decode
        return self.typed

    def row(self, raw, partition: int, offset: int) -> dict | None:
        """One row (raw JSON, or None) of the record at `partition` and `offset`, decoded
        whole."""
        if raw is None:
            return None
        rows = self.rows
        try:
            row = self._typed()(raw)
        except _DECODE_ERRORS:  # decided field by field, as `_Envelopes.generic` does
            return rows.generic(_json(bytes(raw).decode(), _where(partition, offset)))
        rows.finish(row)
        return rows.finish(row, deferred=True)

    def columns(self, raws: list, partition: int, offsets: list[int],
                columns: Sequence[Column]) -> dict[str, list | pa.Array]:  # fmt: skip
        """Rows (raw JSON, or None; of the records at `partition` and `offsets`) decoded
        as `row` decodes each, by column: name -> the values, or an Arrow array of the
        column's lake type for those `column_decoder` decodes a column at a time."""
        from operator import attrgetter

        import msgspec

        rows = self.rows
        if self.struct is None:  # the row's typed fields as a struct's, all None if absent
            self.struct = msgspec.defstruct("Columns", [
                (name, kind, None) for name, kind in rows.types.items()
            ], gc=False)  # fmt: skip
            self.parse = msgspec.json.Decoder(self.struct).decode
        parse, blank = self.parse, self.struct()
        try:
            parsed = [blank if raw is None else parse(raw) for raw in raws]
        except _DECODE_ERRORS:  # a row that `generic` decides: each row as `row` does
            decoded = [self.row(raw, partition, offset)
                       for raw, offset in zip(raws, offsets, strict=True)]  # fmt: skip
            return by_column(decoded, (c.name for c in columns))
        names = [c.name for c in columns if c.name in rows.types]
        if len(names) == 1:
            values = {names[0]: [getattr(r, names[0]) for r in parsed]}
        else:
            by_row = map(attrgetter(*names), parsed)
            values = dict(zip(names, zip(*by_row, strict=True), strict=True))
        out: dict[str, list | pa.Array] = {}
        for c in columns:
            name = c.name
            column = values.get(name)
            if column is None:  # not a field of this schema's rows
                out[name] = [None] * len(raws)
                continue
            fn, fast = self._column_decoders(name, c.type)
            if fn is not None:
                try:
                    if fast is None:
                        raise _Slow
                    column = fast(column)
                except _Slow:
                    column = [None if v is None else fn(v) for v in column]
            out[name] = column
        return out

    def _column_decoders(self, name: str, type_: str) -> tuple[Callable | None, Callable | None]:
        """The value decoder of a column that needs converting (None: its values are
        as parsed) and its `column_decoder`, built once per column and lake type."""
        found = self.column_decoders.get((name, type_))
        if found is None:
            rows = self.rows
            fn = dict(rows.later + rows.deferred).get(name)
            fast = None if fn is None else column_decoder(rows.fields[name], arrow_type(type_))
            found = self.column_decoders[(name, type_)] = (fn, fast)
        return found


def by_column(rows: Sequence[dict | None], names: Iterable[str]) -> dict[str, list]:
    """Decoded rows (None: no row, all its values None) as the values of each column
    named."""
    return {name: [None if r is None else r.get(name) for r in rows] for name in names}


def columns_decoder(value_schema: str, columns: Sequence[Column]):
    """A decoder of the rows (raw JSON, as `_Unparsed.row` takes them) of a value schema
    into its `columns` only: the other fields are parsed past, not decoded."""
    fields = value_row_fields(parse_connect_schema(value_schema), "value")
    return _Unparsed(_Rows(fields, columns)).row


class _Envelopes:
    """A value schema's envelopes: `typed` (msgspec) parses one straight into typed rows
    (`_Rows`) and a source of integer `ts_ms` and `lsn`; a payload it refuses (a value of
    another JSON type, NaN, ...) goes to `generic`, which parses it as plain JSON and
    decodes it field by field into (after, before, op, source ts_ms, source lsn, None)."""

    def __init__(self, fields: Sequence[ConnectField], columns: Sequence[Column],
                 eager: Collection[str] | None = None) -> None:  # fmt: skip
        self.rows = _Rows(fields, columns, eager)
        self.pending = self.rows if self.rows.deferred else None
        self.typed = self.header = self.unparsed = None
        if _DECODE is not None:
            import msgspec

            row = self.rows.type
            envelope = msgspec.defstruct("Envelope", [
                ("before", row | None, None), ("after", row | None, None),
                ("op", Any, None), ("source", _Source | None, None),
            ])  # fmt: skip
            self.typed = msgspec.json.Decoder(envelope).decode
            # the operation and source only: the rows are kept as raw JSON, decoded by
            # `unparsed` when the change is settled
            self.header = _HEADER
            self.unparsed = _Unparsed(self.rows)

    def generic(self, text: str, partition: int, offset: int):
        """An envelope `typed` refused (`decode_records` calls `typed` itself)."""
        where = _where(partition, offset)
        envelope = _json(text, where)
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


class _Keys:
    """A key schema's payloads -> rows (`_Rows`), else parsed as plain JSON and decoded
    field by field."""

    def __init__(self, fields: Sequence[ConnectField], columns: Sequence[Column]) -> None:
        self.rows = _Rows(fields, columns)
        self.typed = None
        if _DECODE is not None:
            from msgspec.json import Decoder

            self.typed = Decoder(self.rows.type | None).decode

    def __call__(self, text: str | None, partition: int, offset: int):
        if self.typed is not None and text is not None:
            try:
                row = self.typed(text)
            except _DECODE_ERRORS:
                pass
            else:
                return self.rows.finish(row) if self.rows.later else row
        return self.rows.generic(_json(text, _where(partition, offset)))


def _where(partition: int, offset: int) -> str:
    return f"partition {partition} offset {offset}"


# ---- records ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Change:
    partition: int
    offset: int
    is_tombstone: bool
    key: dict | None
    after: dict | None
    before: dict | None
    op: str | None
    source_ts_ms: int | None
    lsn: int | None
    ident: tuple = ()  # the key's values: from its key, else its row after, else before
    # what decodes the rest of its rows when it is settled: a `_Rows` (deferred columns)
    # or an `_Unparsed` (rows still raw JSON)
    pending: Any = None


def settle(change: _Change) -> _Change:
    """The change with every column of its rows decoded."""
    rows = change.pending
    if rows is not None:
        change.pending = None
        rows.settle(change)
    return change


def _fast_json():
    """msgspec's JSON decoder (3× `json.loads` here), when installed; its errors (a
    payload it refuses, or one not of the expected types)."""
    try:
        from msgspec import DecodeError, ValidationError
        from msgspec.json import Decoder
    except ImportError:
        return None, ()
    return Decoder().decode, (DecodeError, ValidationError)


_DECODE, _DECODE_ERRORS = _fast_json()


def _header_decoder():
    """A decoder of an envelope's operation and source, its rows kept as raw JSON (a
    JSON null as `NULL_ROW`)."""
    if _DECODE is None:
        return None, None
    import msgspec

    header = msgspec.defstruct("Header", [
        ("before", msgspec.Raw, None), ("after", msgspec.Raw, None),
        ("op", Any, None), ("source", _Source | None, None),
    ])  # fmt: skip
    return msgspec.json.Decoder(header).decode, msgspec.Raw(b"null")


_HEADER, NULL_ROW = _header_decoder()


def _json(text: str | None, where: str):
    if text is None:
        return None
    if _DECODE is not None:
        try:
            return _DECODE(text)
        except _DECODE_ERRORS:
            pass  # e.g. NaN, which `json` takes as Jackson may write it
    try:
        return json.loads(text)
    except ValueError:
        raise BadRecord("the payload is not JSON") from None


def row_decoders(schema: TopicSchema, key_schemas: Mapping[int, str],
                 value_schemas: Mapping[int, str]) -> tuple[dict, dict]:  # fmt: skip
    """The row decoders of each key and value schema (by id). A value's key and
    TOASTable columns are decoded at once, the others once the change is to be written
    (`settle`): a change that a later one replaces never needs them."""
    eager = {*schema.key_names, *(c.name for c in toastable(schema))}
    values = {
        sid: _Envelopes(
            value_row_fields(parse_connect_schema(text), "value"), schema.columns, eager
        )  # fmt: skip
        for sid, text in value_schemas.items()
    }
    keys = {sid: _Keys(parse_connect_schema(text).fields, schema.key)
            for sid, text in key_schemas.items()}  # fmt: skip
    return keys, values


def decode_records(
    rows: pa.Table | pa.RecordBatch,
    schema: TopicSchema,
    key_schemas: Mapping[int, str],
    value_schemas: Mapping[int, str],
    decoders: tuple[dict, dict] | None = None,
    headers_only: bool = False,
) -> list[_Change]:
    """Raw rows of one topic (the reader's, without broken envelopes) -> changes, as
    `decode_changes` makes them; every record must be one that can be applied (a record
    that `invalid_reason` would name is left to the Spark jobs). `decoders` (from
    `row_decoders`) saves building them again for each call.

    `headers_only`: each record's key, operation and source are decoded and checked,
    but its rows are only parsed as far as to find their end and are decoded when the
    change is settled (`settle`): a change that a later one replaces never is, so a
    value that does not fit its column in such a change is never seen (as for the
    deferred columns). A fold that never reads a change's rows (no TOAST columns to
    follow) saves most of the decode this way."""
    keys, values = decoders or row_decoders(schema, key_schemas, value_schemas)
    cols = rows.select(["partition", "offset", "is_tombstone", "key_schema_id", "key_payload",
                        "value_schema_id", "value_payload"]).to_pydict()  # fmt: skip
    ident = _identifier(schema.key_names)
    changes: list[_Change] = []
    append = changes.append
    sid = decode = typed = plain = rest = None
    unparsed = False  # the rows are kept raw (`headers_only`)
    for partition, offset, tombstone, key_sid, key_text, value_sid, value_text in zip(
        cols["partition"], cols["offset"], cols["is_tombstone"], cols["key_schema_id"],
        cols["key_payload"], cols["value_schema_id"], cols["value_payload"], strict=True,
    ):  # fmt: skip
        key = None
        if key_sid is not None:
            decode_key = keys.get(key_sid)
            if decode_key is None:
                raise BadRecord(f"key schema {key_sid} is "
                                  "not among the batch's")  # fmt: skip
            key = decode_key(key_text, partition, offset)
        if value_sid is None:
            change = _Change(partition, offset, bool(tombstone), key,
                             None, None, None, None, None, ident(key, None, None))  # fmt: skip
        else:
            if value_sid != sid:  # the envelopes' fast path, inlined (`_Envelopes`)
                decode = values.get(value_sid)
                if decode is None:
                    raise BadRecord(f"value schema "
                                      f"{value_sid} is not among the batch's")  # fmt: skip
                sid = value_sid
                unparsed = headers_only and decode.header is not None
                if unparsed:
                    typed, plain, rest = decode.header, True, decode.unparsed
                else:
                    typed, plain, rest = decode.typed, not decode.rows.later, decode.pending
            e = None
            if typed is not None:
                try:
                    e = typed(value_text)
                except _DECODE_ERRORS:
                    pass
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
                    change = _Change(partition, offset, bool(tombstone), key, after, before,
                                     op, ts, lsn, ident(key, None, None), rest)  # fmt: skip
                    if None in change.ident:  # the key lacks a value: look in the rows
                        change.ident = ident(key, settle(change).after, change.before)
                else:
                    change = _Change(partition, offset, bool(tombstone), key, after, before,
                                     op, ts, lsn, ident(key, after, before), rest)  # fmt: skip
            else:
                after, before, op, ts, lsn, pending = decode.generic(value_text, partition, offset)
                change = _Change(partition, offset, bool(tombstone), key, after, before, op,
                                 ts, lsn, ident(key, after, before), pending)  # fmt: skip
        if not tombstone:
            op = change.op
            if op.__class__ is not str or op not in _OPS:
                raise BadRecord(f"unknown operation {op}")
            values_of_key = change.ident
            if (op != TRUNCATE and values_of_key
                    and values_of_key.count(None) == len(values_of_key)):  # fmt: skip
                raise BadRecord("record has no key")
        append(change)
    return changes


_OPS = frozenset((*ROW_OPS, TRUNCATE))


def _identifier(names: Sequence[str]) -> Callable[[dict | None, dict | None, dict | None], tuple]:
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


def last_truncate(changes: Sequence[_Change]) -> Truncate | None:
    """The truncate with the highest offset."""
    found = [c for c in changes if not c.is_tombstone and c.op == TRUNCATE]
    if not found:
        return None
    last = max(found, key=lambda c: (c.offset, c.partition))
    return Truncate(last.partition, last.offset, last.lsn)


def _after_truncate(changes: Sequence[_Change], truncate: Truncate | None) -> list[_Change]:
    rows = [c for c in changes if c.op != TRUNCATE]
    if truncate is None:
        return rows

    def kept(c: _Change) -> bool:
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
    changes: Sequence[_Change], schema: TopicSchema, flags: bool | None = None
) -> tuple[list[dict], Truncate | None, bool]:
    """`resolve_latest`'s rows (dicts of its columns), the truncate, and whether the rows
    carry the TOAST flags: when a placeholder was among the values, or as `flags` says
    (False: there must be no placeholder)."""
    check_key_types(schema)
    truncate = last_truncate(changes)
    toasty = toastable(schema)
    rows = []
    for c in _after_truncate(changes, truncate):
        key = c.ident
        if c.is_tombstone and all(v is None for v in key):
            continue  # a tombstone without key carries nothing
        rows.append((key, c))
    groups: dict[tuple, list[_Change]] = {}
    for key, c in sorted(rows, key=lambda kc: (kc[1].partition, kc[1].offset)):
        groups.setdefault(key, []).append(c)
    found = any(is_placeholder(c.after.get(col.name), col)
                for _, c in rows if c.after is not None for col in toasty)  # fmt: skip
    if found and flags is False:
        raise RuntimeError("a TOAST placeholder the raw scan did not see")
    toast = found if flags is None else flags
    toast_cols = toasty if toast else []
    toast_of = ToastColumns(toast_cols)
    out, shape = [], RowShape(schema, toast_of)
    for key, group in groups.items():
        fold = KeyFold()
        for c in group:
            fold.add(c, toast_of)
        if fold.r is not None:
            out.append(fold.row(key, shape))
    return out, truncate, toast


class KeyFold:
    """One key's changes folded in Kafka order into what its resolved row needs:
    `drop_stale` (a change whose LSN is not above every earlier one's is a re-send; a
    tombstone goes with the change before it) and `resolve_latest` over the changes
    kept. Holds one key's latest state, not its changes."""

    __slots__ = ("seen", "prev_stale", "r", "lsn", "change", "after", "real", "base")

    def __init__(self) -> None:
        self.seen: int | None = None  # the highest LSN of the key's changes so far
        self.prev_stale = True  # a first tombstone follows nothing and is dropped
        self.r: _Change | None = None  # the kept change with the highest offset
        self.lsn: int | None = None  # the highest LSN of the kept changes
        self.change: _Change | None = None  # the kept change (not tombstone), highest offset
        self.after: _Change | None = None  # the kept change with a row, highest offset
        # the last real value of each TOAST column: the one of highest offset among
        # `real` (column -> (offset, value)) and `base`, the kept change of highest
        # offset whose every TOAST column held a real value (most changes)
        self.real: dict[str, tuple[int, Any]] = {}
        self.base: _Change | None = None

    def add(self, c: _Change, toast: ToastColumns = NO_TOAST) -> None:
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
        """The key's resolved row (`resolve_latest`'s columns), with the TOAST flags of
        the shape's columns (those `add` was given)."""
        after = self.values()
        if after is None:
            row = dict.fromkeys(shape.names)
        else:
            row = {name: after.get(name) for name in shape.names}
        row.update(zip(shape.key_names, key, strict=True))
        row.update(zip(META, self.meta(), strict=True))
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
    whose flags it carries (name, placeholder, flag column)."""

    __slots__ = ("names", "key_names", "toast")

    def __init__(self, schema: TopicSchema, toast: ToastColumns = NO_TOAST) -> None:
        self.names = tuple(c.name for c in schema.columns)
        self.key_names = schema.key_names
        self.toast = tuple((name, mark, f"{TOAST_PREFIX}{name}") for name, mark in toast.pairs)


def changelog_rows(changes: Sequence[_Change], schema: TopicSchema) -> list[dict]:
    """`changelog`'s rows: every change of a table without a key."""
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


# ---- the table the MERGE reads -----------------------------------------------------------


def _split_top(text: str) -> list[str]:
    """Split at the commas outside <> and ()."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def arrow_type(ddl: str) -> pa.DataType:
    """The Arrow type Spark reads as the Spark type `ddl` (the lake's types)."""
    import pyarrow as pa

    ddl = ddl.strip()
    simple = {
        "int": pa.int32(), "bigint": pa.int64(), "float": pa.float32(), "double": pa.float64(),
        "boolean": pa.bool_(), "string": pa.string(), "binary": pa.binary(),
        "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"),
        "timestamp_ntz": pa.timestamp("us"),
    }  # fmt: skip
    if ddl in simple:
        return simple[ddl]
    if ddl.startswith("decimal("):
        precision, scale = (int(x) for x in ddl[8:-1].split(","))
        return pa.decimal128(precision, scale)
    if ddl.startswith("array<"):
        return pa.list_(arrow_type(ddl[6:-1]))
    if ddl.startswith("map<"):
        key, value = _split_top(ddl[4:-1])
        return pa.map_(arrow_type(key), arrow_type(value))
    if ddl.startswith("struct<"):
        fields = []
        for part in _split_top(ddl[7:-1]):
            name, _, type_ = part.partition(":")
            fields.append(pa.field(name.strip("`"), arrow_type(type_)))
        return pa.struct(fields)
    raise DecodeError(f"type {ddl} has no Arrow form here")


def columns_ddl(columns: Sequence[tuple[str, str]]) -> str:
    """The Spark schema (DDL) of (name, Spark type) columns."""
    return ", ".join(f"`{name}` {type_}" for name, type_ in columns)


def result_columns(schema: TopicSchema, keyed: bool, toast: bool) -> list[tuple[str, str]]:
    """(name, Spark type) of the resolved rows, in `resolve_latest`'s (or `changelog`'s)
    order."""
    cols = [(c.name, c.type) for c in schema.columns]
    cols += [(DELETED, "boolean"), (OP, "string"), (SOURCE_TS, "timestamp"), (LSN, "bigint")]
    if keyed:
        cols += [(STALE_CHECK_LSN, "bigint"), (HAS_VALUES, "boolean")]
    cols += [(PARTITION, "int"), (OFFSET, "bigint")]
    if keyed and toast:
        cols += [(f"{TOAST_PREFIX}{c.name}", "boolean") for c in toastable(schema)]
    return cols


def rows_table(rows: Sequence[dict], columns: Sequence[tuple[str, str]]) -> pa.Table:
    """Rows (dicts) as an Arrow table of (name, Spark type) columns."""
    return columns_table({name: [r[name] for r in rows] for name, _ in columns}, columns)


def columns_table(data: Mapping[str, list], columns: Sequence[tuple[str, str]]) -> pa.Table:
    """Columns' values (lists by name) as an Arrow table of (name, Spark type) columns."""
    import pyarrow as pa

    arrays, fields = [], []
    for name, type_ in columns:
        kind = arrow_type(type_)
        values = data[name]
        try:
            if isinstance(values, pa.Array):  # a column decoded as one (`column_decoder`)
                arrays.append(values if values.type == kind else values.cast(kind))
            else:
                arrays.append(pa.array(values, type=kind))
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise DecodeError(f"column {name!r} ({type_}): {exc}") from None
        fields.append(pa.field(name, kind))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def resolve_rows(
    rows: pa.Table,
    schema: TopicSchema,
    key_schemas: Mapping[int, str],
    value_schemas: Mapping[int, str],
    flags: bool | None = None,
) -> DriverResolved:
    """Raw rows of one topic -> the resolved rows, what the checks found and the records
    that cannot be applied (`flags`: see `resolve_changes`)."""
    keyed = bool(schema.key_names)
    check_key_types(schema)
    bad: list[tuple[int, int, str]] = []
    with cycles_uncollected():
        try:
            out, truncate, toast = _resolve(
                decode_records(rows, schema, key_schemas, value_schemas), schema, flags
            )
        except BadRecord:  # find each record that cannot be applied, and leave it out
            changes = decode_each(rows, schema, key_schemas, value_schemas, bad)
            out, truncate, toast = _resolve(changes, schema, flags)
    columns = result_columns(schema, keyed, toast)
    table = rows_table(out, columns)
    counts: dict[bool, int] = {}
    latest_ms = tally(table, counts, None)
    return DriverResolved(table, columns_ddl(columns), truncate, counts, latest_ms, toast,
                          tuple(bad))  # fmt: skip


def _resolve(changes: list[_Change], schema: TopicSchema, flags: bool | None):
    if schema.key_names:
        return resolve_changes(changes, schema, flags)
    return changelog_rows(changes, schema), None, False


def decode_each(rows: pa.Table, schema: TopicSchema, key_schemas: Mapping[int, str],
                value_schemas: Mapping[int, str], bad: list) -> list[_Change]:  # fmt: skip
    """The changes of the records that can be applied, each decoded alone and whole;
    each other record's (partition, offset, reason) is appended to `bad`."""
    decoders = row_decoders(schema, key_schemas, value_schemas)
    changes = []
    for i in range(rows.num_rows):
        one = rows.slice(i, 1)
        try:
            [change] = decode_records(one, schema, key_schemas, value_schemas, decoders)
            changes.append(settle(change))
        except BadRecord as why:
            bad.append((one["partition"][0].as_py(), one["offset"][0].as_py(), str(why)))
    return changes


@contextmanager
def cycles_uncollected() -> Iterator[None]:
    """Python's cyclic collector paused: the changes, rows and key states a resolve makes
    are many objects without reference cycles (reference counting frees them), which
    the collector would walk again and again as they pile up (~35% of a decode)."""
    import gc

    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def tally(table: pa.Table, counts: dict[bool, int], latest_ms: int | None) -> int | None:
    """Counts the resolved rows by their deleted flag into `counts`; returns the latest
    source time (ms) among them and `latest_ms`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    deleted = pc.sum(table.column(DELETED)).as_py() or 0
    for flag, n in ((False, table.num_rows - deleted), (True, deleted)):
        if n:
            counts[flag] = counts.get(flag, 0) + n
    ts = pc.max(table.column(SOURCE_TS).cast(pa.int64())).as_py()
    if ts is not None and (latest_ms is None or ts // 1000 > latest_ms):
        latest_ms = ts // 1000
    return latest_ms


# ---- the same in Spark tasks, for batches the driver did not read -------------------------

RAW_COLUMNS = ("partition", "offset", "is_tombstone", "key_schema_id", "key_payload",
               "value_schema_id", "value_payload")  # fmt: skip
TASK_RECORDS = 50_000  # records of one topic per resolving task (on average)
# a column of what `resolve_task` returns: NULL on a resolved row; on a row that only
# reports, the reason of a record that cannot be applied, or `TRUNCATE_MARK`
REASON = "_cdc_reason"
TRUNCATE_MARK = "truncate"


def grouped_by_kafka_key(schema: TopicSchema, key_schemas: Mapping[int, str], table_key) -> bool:
    """Whether all the records of a key in the batch have the same Kafka key text: the
    key is the Kafka key (not a configured one) and has one schema in the batch."""
    return bool(schema.key_names) and not table_key and len(key_schemas) == 1


def resolve_task(schema: TopicSchema, key_schemas: Mapping[int, str],
                 value_schemas: Mapping[int, str], toast: bool):  # fmt: skip
    """A `mapInArrow` function: the raw records of some keys (all of each key's records
    in the batch) -> their resolved rows (with the TOAST flags when `toast`), then a row
    for each record that cannot be applied and for a truncate (`REASON`)."""
    key_schemas, value_schemas = dict(key_schemas), dict(value_schemas)
    columns = task_columns(schema, toast)

    def task(batches):
        import pyarrow as pa

        parts = [b for b in batches if b.num_rows]
        if not parts:
            return
        rows = pa.Table.from_batches(parts)
        done = resolve_rows(rows, schema, key_schemas, value_schemas,
                            flags=toast if schema.key_names else None)  # fmt: skip
        yield from done.rows.append_column(
            REASON, pa.nulls(done.rows.num_rows, pa.string())).to_batches()  # fmt: skip
        marks = [{PARTITION: p, OFFSET: o, REASON: why} for p, o, why in done.bad]
        if done.truncate is not None:
            t = done.truncate
            marks.append({PARTITION: t.partition, OFFSET: t.offset, LSN: t.lsn,
                          REASON: TRUNCATE_MARK})  # fmt: skip
        if marks:
            yield from rows_table([{**dict.fromkeys(n for n, _ in columns), **m} for m in marks],
                                  columns).to_batches()  # fmt: skip

    return task


def task_columns(schema: TopicSchema, toast: bool) -> list[tuple[str, str]]:
    """(name, Spark type) of what `resolve_task` returns."""
    return [*result_columns(schema, bool(schema.key_names), toast), (REASON, "string")]
