"""Debezium's JSON-converter values -> the values of their lake columns, as Arrow takes them
(dates as days, timestamps as microseconds, decimals as `Decimal`), by `decoder`. A value
that does not fit its column raises `BadRecord`, naming its field."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import math
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any, cast

from cdclake.debezium.connect import (
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
)
from cdclake.debezium.formats import BadRecord
from cdclake.exceptions import DecodeError

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


def _integer(value: Any, field: ConnectField, bounds: tuple[int, int]) -> int:
    if type(value) is not int or not bounds[0] <= value <= bounds[1]:
        raise BadRecord(f"field {field.name!r}: {value!r} is not a {field.type}")
    return value


def _number(value: Any, field: ConnectField) -> float:
    if isinstance(value, str) and value in _FLOAT_TEXTS:
        return _FLOAT_TEXTS[value]
    if type(value) not in (int, float):
        raise BadRecord(f"field {field.name!r}: {value!r} is not a number")
    return float(value)


def _float32(value: float) -> float:
    """The value a float column holds (Spark parses JSON into a 32-bit float)."""
    try:
        out: float = struct.unpack("f", struct.pack("f", value))[0]
        return out
    except (OverflowError, struct.error):
        raise BadRecord(f"{value!r} is out of a 32-bit float's range") from None


def _unbase64(value: Any, field: ConnectField) -> bytes:
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

    def decode(value: Any) -> Any:
        # integers only: Decimal arithmetic rounds to 28 digits
        unscaled = int.from_bytes(_unbase64(value, field), "big", signed=True)
        if raw_scale < 0:
            unscaled *= 10**-raw_scale
        if abs(unscaled) >= limit:  # Spark makes it NULL: a value that does not fit
            raise BadRecord(
                f"field {field.name!r}: {unscaled}E{-max(raw_scale, 0)} does not "
                "fit its decimal type"
            )
        return Decimal(f"{unscaled}E{-max(raw_scale, 0)}")

    return decode


def _variable_scale(field: ConnectField) -> Callable[[Any], Any]:
    def decode(value: Any) -> Any:
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
    def decode(value: Any) -> Any:
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


def _infinity(
    values: tuple[int, int], top: int, bottom: int, scale: int, field: ConnectField
) -> Callable[[Any], Any]:
    def decode(value: Any) -> Any:
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
        return lambda v: _ranged(
            _integer(v, field, _INT64) // 1000, _MIN_MICROS, _MAX_MICROS, f"field {field.name!r}:"
        )
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

        def geo(value: Any) -> dict[str, Any]:
            if not isinstance(value, dict):
                raise BadRecord(f"field {field.name!r}: {value!r} is not a geometry")
            wkb, srid = value.get("wkb"), value.get("srid")
            return {
                "wkb": None if wkb is None else _unbase64(wkb, field),
                "srid": None if srid is None else _integer(srid, field, _INT32),
            }

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
        return _checked(
            field, list, "an array", lambda v: [None if x is None else item(x) for x in v]
        )
    if kind == "map" and field.values is not None:
        member = decoder(field.values)
        return _checked(
            field,
            dict,
            "a map",
            lambda v: [(k, None if x is None else member(x)) for k, x in v.items()],
        )
    if kind == "struct":  # kept as JSON text (a point's x, y, wkb, srid)
        return lambda v: _json_text(v, field)
    raise DecodeError(f"field {field.name!r}: Connect type {kind} has no lake type")


def _checked(
    field: ConnectField, kind: type, what: str, convert: Callable[[Any], Any] | None = None
) -> Callable[[Any], Any]:
    """A decoder of JSON values of one Python type (`convert`ed, when given)."""

    def decode(value: Any) -> Any:
        if not isinstance(value, kind):
            raise BadRecord(f"field {field.name!r}: {value!r:.60} is not {what}")
        return value if convert is None else convert(value)

    return decode


def _json_text(value: Any, field: ConnectField) -> str:
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
    power = cast(int, exponent) + len(digits) - 1  # a finite value's: a number
    return f"{'-' if sign else ''}{text[0]}.{text[1:] or '0'}E{power}"
