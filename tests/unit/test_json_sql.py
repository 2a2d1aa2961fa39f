"""DuckDB's SQL of each plainly typed Connect field (`json_sql.leaf`, the one decoder of
these types) gives the lake value and the verdict of a reference written from the JSON
converter's documented encodings (below), on values of every JSON type, at and past each
range's ends and ±infinity."""

import datetime as dt
import json
import math
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from cdclake.debezium.connect import (
    CONNECT_DATE,
    DATE,
    DECIMAL,
    INFINITY_DAYS,
    INFINITY_MICROS,
    INFINITY_MILLIS,
    MICRO_TIMESTAMP,
    NANO_TIMESTAMP,
    TIMESTAMP,
    ZONED_TIMESTAMP,
    ConnectField,
    decimal_params,
)
from cdclake.debezium.formats import BadRecord
from cdclake.debezium.json_decode import lake_values
from cdclake.debezium.json_sql import _TYPED, changes_sql, leaf
from cdclake.debezium.json_values import _INT32, _INT64, _integer, _unbase64

duckdb = pytest.importorskip("duckdb")


def field(kind: str, logical: str | None = None, **params: str) -> ConnectField:
    return ConnectField(name="x", type=kind, optional=True, logical=logical,
                        params=tuple(sorted(params.items())), fields=(), items=None,
                        values=None)  # fmt: skip


VALUES = [
    0, 1, -1, 7, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63 - 1, 2**63, 1.5, -0.0, 3.4e38,
    1e39, 1e300, "NaN", "Infinity", "-Infinity", "abc", "", "AQID", "%%%", True, False, None,
    [1], {"a": 1}, *INFINITY_DAYS, *INFINITY_MILLIS, *INFINITY_MICROS, 1795334231546046, -1500,
    2932896, 2932897, -719162, -719163, 253402300799999, 253402300800000,
    "AeJA", "/w==", "gA==", "AA==", "f////w==", "gAAAAAAAAAAAAAAAAAAAAA==", "S3Xh",
    "Ejs+lzvAAAAAAAAAAAAAAAA=", "AQAAAAAAAAAAAAAAAAAAAAAA", "2026-11-22T07:57:11.546046Z",
    "2026-11-22T07:57:11+02:00", "2026-11-22T07:57:11", "infinity", "-infinity",
]  # fmt: skip
FIELDS = [field(k) for k in ("int8", "int16", "int32", "int64", "float32", "float64",
                             "boolean", "string", "bytes")] + [
    field("int32", DATE), field("int32", CONNECT_DATE), field("int64", TIMESTAMP),
    field("int64", MICRO_TIMESTAMP), field("int64", NANO_TIMESTAMP),
    field("string", ZONED_TIMESTAMP), field("string", "io.debezium.data.Json"),
    field("bytes", DECIMAL, scale="2", **{"connect.decimal.precision": "10"}),
    field("bytes", DECIMAL, scale="0"), field("bytes", DECIMAL, scale="-3",
                                              **{"connect.decimal.precision": "5"}),
]  # fmt: skip


def python(f: ConnectField, value):
    """The reference's lake value as SQL gives it, and whether it refused it."""
    if value is None:
        return None, False
    try:
        return as_sql(f, reference(f)(value)), False
    except BadRecord:
        return None, True


def as_sql(f: ConnectField, value):
    """A Python decoder's lake value as SQL gives it (days as a date, microseconds as a
    timestamp)."""
    if value is None or f.logical not in (DATE, CONNECT_DATE, TIMESTAMP, MICRO_TIMESTAMP,
                                          NANO_TIMESTAMP, ZONED_TIMESTAMP, DECIMAL):  # fmt: skip
        return value
    if f.logical == DECIMAL:  # SQL gives the unscaled value of the lake decimal
        return int(value.scaleb(max(0, int(f.param("scale", "0")))))
    if f.logical == ZONED_TIMESTAMP:
        return pa.scalar(value, pa.int64()).cast(pa.timestamp("us", "UTC")).as_py()
    if f.logical in (DATE, CONNECT_DATE):
        return pa.scalar(value, pa.int32()).cast(pa.date32()).as_py()
    return pa.scalar(value, pa.int64()).cast(pa.timestamp("us")).as_py()


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f"{f.type}-{(f.logical or '').split('.')[-1]}")
def test_the_sql_of_a_field_decodes_as_its_python_decoder(f):
    """The value and verdict of the Python decoder, but that a plainly typed field takes
    a value of another JSON type DuckDB converts (as `from_json_strict` converts it)."""
    con, got = duckdb.connect(), leaf(f, "j.x")
    query = (f"SELECT {got.value}, {got.error} FROM (SELECT from_json(?, "
             """'{"x":"JSON"}') AS j)""")  # fmt: skip
    converts = f.type in _TYPED or f.type == "float32"  # see json_sql's docstring
    for value in VALUES:
        want, refused = python(f, value)
        lake, why = con.execute(query, [json.dumps({"x": value})]).fetchall()[0]
        if converts and refused and why is None:  # a value DuckDB converts: as it casts
            cast = "DOUBLE" if f.type == "float32" else _TYPED[f.type]
            (strict,) = con.execute(
                f"SELECT TRY(from_json_strict(?, '{{\"x\":\"{cast}\"}}')).x",
                [json.dumps({"x": value})]).fetchall()[0]  # fmt: skip
            assert lake == (pytest.approx(strict, rel=1e-6) if f.type == "float32" else strict)
            continue
        assert (why is not None) == refused, (value, lake, why, want)
        if refused:
            assert why.startswith("field 'x': ") and (" is not " in why or " does not fit " in why)
        elif isinstance(want, float) and math.isnan(want):
            assert math.isnan(lake), (value, lake)
        else:
            assert lake == want, (value, lake, want)


@pytest.mark.parametrize("seed", range(30))
def test_a_fold_in_steps_gives_the_rows_of_one_fold(seed):
    """A random history of one partition (re-sends, truncates, TOAST placeholders, snapshot
    reads) decoded by `changes_sql` and folded in random steps (`fold_step`): what is held
    at the end resolves to the rows of the whole history, and holds no more records than
    the needed ones of its keys."""
    import random

    from cdclake.debezium.json_records import key_fields, value_fields
    from cdclake.resolve.arrow_fold import fold_step, resolve_table

    from tests.unit.test_resolve import history, raw_table, topic_of

    rows = raw_table(history(seed, partitions=1, toast=seed % 3 != 0))
    schema, keys, values = topic_of(rows)
    [key_text], [value_text] = keys.values(), values.values()
    kf, vf = key_fields(key_text), value_fields(value_text, "value")
    con = duckdb.connect()
    con.register("raw", rows)
    changes = lake_values(con.sql(changes_sql(kf, vf, schema)).to_arrow_table(), vf, schema)
    want, want_truncate, _ = resolve_table(changes, schema)
    rnd = random.Random(seed)
    cuts = sorted(rnd.sample(range(1, changes.num_rows), min(4, changes.num_rows - 1)))
    held, truncate = None, None
    for start, end in zip([0, *cuts], [*cuts, changes.num_rows], strict=True):
        # as a range's fold does: the truncate of an earlier step goes on dropping
        held, found, _ = fold_step(held, changes.slice(start, end - start), schema, None,
                                   truncate)  # fmt: skip
        truncate = found or truncate
    got, _, _ = resolve_table(held, schema)
    names = [n for n in want if n in got]
    for n in set(want) - set(got):  # TOAST flags: only where a kept change holds a placeholder
        assert not any(want[n].to_pylist()), n
    rows_of = lambda data: sorted(zip(*(data[n].to_pylist() for n in names), strict=True),  # noqa: E731
                                  key=repr)  # fmt: skip
    assert rows_of(got) == rows_of(want)
    assert truncate == want_truncate
    assert held.num_rows <= 8 * 6  # a few records per key of at most 6 keys


@pytest.mark.parametrize("kind", sorted(_TYPED))
def test_a_typed_read_gives_the_checked_values_or_refuses_the_record(kind):
    """`from_json_strict` into a field's SQL type (the unchecked read) gives the value the
    checked leaf gives, or refuses the record where the leaf says it does not fit."""
    f = field(kind)
    con, got = duckdb.connect(), leaf(f, "j.x")
    checked = f'SELECT {got.value}, {got.error} FROM (SELECT from_json(?, \'{{"x":"JSON"}}\') AS j)'
    typed = f'SELECT TRY(from_json_strict(?, \'{{"x":"{_TYPED[kind]}"}}\'))'
    for value in [*VALUES, 'a"b\\c\u00e9\n', {"a": [1, {"b": None}]}, " 12 ", "1e3", "0x10"]:
        text = json.dumps({"x": value})
        lake, why = con.execute(checked, [text]).fetchall()[0]
        (row,) = con.execute(typed, [text]).fetchall()[0]
        if why is not None:
            assert row is None, (value, row, why)
        elif isinstance(lake, float) and math.isnan(lake):
            assert math.isnan(row["x"]), value
        else:
            assert row == {"x": lake}, (value, row, lake)


# ---- the oracle: each JSON converter encoding decoded by its documented rule, in Python ----
_EPOCH_DAY = dt.date(1970, 1, 1).toordinal()
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICRO = dt.timedelta(microseconds=1)
# the ends of the range Spark and Iceberg share, which ±infinity loads as (debezium.py)
_MAX_DAY = dt.date(9999, 12, 31).toordinal() - _EPOCH_DAY
_MIN_DAY = dt.date(1, 1, 1).toordinal() - _EPOCH_DAY
_MAX_MICROS = (dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC) - _EPOCH) // _MICRO
_MIN_MICROS = (dt.datetime(1, 1, 1, tzinfo=dt.UTC) - _EPOCH) // _MICRO
_FLOAT_TEXTS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


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


def reference(field: ConnectField) -> Callable[[Any], Any]:
    """The lake value of a JSON value of a plainly typed `field` (BadRecord: it does not
    fit), by the JSON converter's documented encodings: what `leaf`'s SQL must give."""
    lg = field.logical
    if lg == DECIMAL:
        return _decimal(field)
    if lg in (DATE, CONNECT_DATE):
        return _infinity(INFINITY_DAYS, _MAX_DAY, _MIN_DAY, 1, field)
    if lg == TIMESTAMP:
        return _infinity(INFINITY_MILLIS, _MAX_MICROS, _MIN_MICROS, 1000, field)
    if lg == MICRO_TIMESTAMP:
        return _infinity(INFINITY_MICROS, _MAX_MICROS, _MIN_MICROS, 1, field)
    if lg == NANO_TIMESTAMP:
        return lambda v: _ranged(
            _integer(v, field, _INT64) // 1000, _MIN_MICROS, _MAX_MICROS, f"field {field.name!r}:"
        )
    if lg == ZONED_TIMESTAMP:
        return _zoned(field)
    kind = field.type
    if kind == "bytes":
        return lambda v: _unbase64(v, field)
    if kind in ("int8", "int16", "int32", "int64"):
        return lambda v: _integer(v, field, _INT64 if kind == "int64" else _INT32)
    if kind in ("float32", "float"):
        return lambda v: _float32(_number(v, field))
    if kind in ("float64", "double"):
        return lambda v: _number(v, field)
    want = {"boolean": bool, "string": str}[kind]

    def checked(value: Any) -> Any:
        if not isinstance(value, want):
            raise BadRecord(f"field {field.name!r}: {value!r:.60} is not {kind}")
        return value

    return checked
