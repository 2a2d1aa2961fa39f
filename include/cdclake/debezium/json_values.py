"""Debezium's JSON-converter values of the types DuckDB's SQL does not decode
(`json_sql.leaf`) -> the values of their lake columns, as Arrow takes them, by `decoder`.
A value that does not fit its column raises `BadRecord`, naming its field."""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable
from decimal import Decimal
from typing import Any, cast

from cdclake.debezium.connect import (
    CONNECT_TIME,
    GEOGRAPHY,
    GEOMETRY,
    MICRO_TIME,
    NANO_TIME,
    TIME,
    VARIABLE_SCALE_DECIMAL,
    ConnectField,
)
from cdclake.debezium.formats import BadRecord
from cdclake.exceptions import DecodeError

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


def _integer(value: Any, field: ConnectField, bounds: tuple[int, int]) -> int:
    if type(value) is not int or not bounds[0] <= value <= bounds[1]:
        raise BadRecord(f"field {field.name!r}: {value!r} is not a {field.type}")
    return value


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


def _geometry(field: ConnectField) -> Callable[[Any], Any]:
    def decode(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise BadRecord(f"field {field.name!r}: {value!r} is not a geometry")
        wkb, srid = value.get("wkb"), value.get("srid")
        return {
            "wkb": None if wkb is None else _unbase64(wkb, field),
            "srid": None if srid is None else _integer(srid, field, _INT32),
        }

    return decode


# microseconds per tick of each time of day
_TIME_TICKS = {TIME: 1000, CONNECT_TIME: 1000, MICRO_TIME: 1, NANO_TIME: None}


def decoder(field: ConnectField) -> Callable[[Any], Any]:
    """A function from the JSON value of `field` (not None) to the value of its lake type
    as Arrow takes it; `BadRecord` for a value that does not fit. For the types DuckDB's
    SQL does not decode (`json_sql.leaf` gives no value for them): times of day, variable-
    scale decimals, geometries, and other structs (kept as JSON text)."""
    lg = field.logical
    if lg in _TIME_TICKS:
        per_tick = _TIME_TICKS[lg]
        if per_tick is None:  # nanoseconds
            return lambda v: _time_text(_integer(v, field, _INT64) // 1000)
        return lambda v: _time_text(_integer(v, field, _INT64) * per_tick)
    if lg == VARIABLE_SCALE_DECIMAL:
        return _variable_scale(field)
    if lg in (GEOMETRY, GEOGRAPHY):
        return _geometry(field)
    if field.type == "struct":  # kept as JSON text (a point's x, y, wkb, srid)
        return lambda v: _json_text(v, field)
    raise DecodeError(f"field {field.name!r}: Connect type {field.type} has no lake type")


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
