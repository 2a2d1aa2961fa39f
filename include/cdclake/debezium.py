"""Debezium / Kafka Connect JSON schemas: what a field is, how Spark parses it, and which
lossless Iceberg-compatible type it becomes.

Parsing happens in the JVM (`from_json` with a type derived from the record's own schema)
and every conversion is a Spark column expression: no Python per row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdclake.exceptions import DecodeError

DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
DATE = "io.debezium.time.Date"
CONNECT_DATE = "org.apache.kafka.connect.data.Date"
TIMESTAMP = "io.debezium.time.Timestamp"
CONNECT_TIMESTAMP = "org.apache.kafka.connect.data.Timestamp"
MICRO_TIMESTAMP = "io.debezium.time.MicroTimestamp"
NANO_TIMESTAMP = "io.debezium.time.NanoTimestamp"
ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
TIME = "io.debezium.time.Time"
CONNECT_TIME = "org.apache.kafka.connect.data.Time"
MICRO_TIME = "io.debezium.time.MicroTime"
NANO_TIME = "io.debezium.time.NanoTime"

GEOMETRY = "io.debezium.data.geometry.Geometry"
GEOGRAPHY = "io.debezium.data.geometry.Geography"
GEO_LAKE_TYPE = "struct<wkb:binary,srid:int>"  # wkb: PostGIS EWKB, exactly as stored

MAX_DECIMAL_PRECISION = 38


@dataclass(frozen=True)
class ConnectField:
    """One field of a Kafka Connect schema, as written by the JSON converter."""

    name: str
    type: str
    optional: bool = True
    logical: str | None = None
    params: tuple[tuple[str, str], ...] = ()
    fields: tuple[ConnectField, ...] = ()  # struct members
    items: ConnectField | None = None  # array element
    values: ConnectField | None = None  # map value

    def param(self, key: str, default: str | None = None) -> str | None:
        return dict(self.params).get(key, default)

    def child(self, name: str) -> ConnectField | None:
        for f in self.fields:
            if f.name == name:
                return f
        return None


def parse_connect_schema(schema: Mapping[str, Any] | str, name: str = "") -> ConnectField:
    """Turn the `schema` part of a JSON-with-schema record into a ConnectField tree."""
    if isinstance(schema, str):
        schema = json.loads(schema)
    kind = schema.get("type")
    if not isinstance(kind, str):
        raise DecodeError(f"schema of {name or 'record'} has no type: {str(schema)[:200]}")
    params = schema.get("parameters") or {}
    return ConnectField(
        name=schema.get("field", name),
        type=kind,
        optional=bool(schema.get("optional", True)),
        logical=schema.get("name"),
        params=tuple(sorted((str(k), str(v)) for k, v in params.items())),
        fields=tuple(parse_connect_schema(f) for f in schema.get("fields", ()) or ()),
        items=parse_connect_schema(schema["items"], "items") if "items" in schema else None,
        values=parse_connect_schema(schema["values"], "values") if "values" in schema else None,
    )


# ---- Spark types ---------------------------------------------------------------------

_PRIMITIVE_PARSE = {
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "bigint",
    "float32": "float",
    "float": "float",
    "float64": "double",
    "double": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "string",  # base64 text in JSON
}


def parse_type(f: ConnectField) -> str:
    """The Spark type `from_json` should read this field's JSON as (DDL string)."""
    if f.type == "struct":
        if f.logical == VARIABLE_SCALE_DECIMAL:
            return "struct<scale:int,value:string>"
        if f.logical in (GEOMETRY, GEOGRAPHY):
            return "struct<wkb:string,srid:int>"
        return "string"  # kept as its JSON text
    if f.type == "array" and f.items is not None:
        return f"array<{parse_type(f.items)}>"
    if f.type == "map" and f.values is not None:
        return f"map<string,{parse_type(f.values)}>"
    try:
        return _PRIMITIVE_PARSE[f.type]
    except KeyError:
        raise DecodeError(f"field {f.name!r} has unknown Connect type {f.type!r}") from None


def lake_type(f: ConnectField) -> str:
    """The Spark (and so Iceberg) type a field is stored as."""
    lg = f.logical
    if lg == DECIMAL:
        precision, scale = decimal_params(f)
        return f"decimal({precision},{scale})"
    if lg in (DATE, CONNECT_DATE):
        return "date"
    if lg in (TIMESTAMP, CONNECT_TIMESTAMP, MICRO_TIMESTAMP, NANO_TIMESTAMP):
        return "timestamp_ntz"
    if lg == ZONED_TIMESTAMP:
        return "timestamp"
    if lg in (TIME, CONNECT_TIME, MICRO_TIME, NANO_TIME):
        return "string"  # 'HH:MM:SS.ffffff': Spark 3.5 cannot write Iceberg's time type
    if lg == VARIABLE_SCALE_DECIMAL:
        return "string"  # exact decimal text: the scale varies per value
    if lg in (GEOMETRY, GEOGRAPHY):
        return GEO_LAKE_TYPE
    if f.type == "bytes":
        return "binary"
    if f.type in ("int8", "int16"):
        return "int"
    if f.type == "array" and f.items is not None:
        return f"array<{lake_type(f.items)}>"
    if f.type == "map" and f.values is not None:
        return f"map<string,{lake_type(f.values)}>"
    if f.type == "struct":
        return "string"
    return parse_type(f)


def decimal_params(f: ConnectField) -> tuple[int, int]:
    scale = int(f.param("scale", "0") or 0)
    precision_text = f.param("connect.decimal.precision")
    precision = int(precision_text) if precision_text else MAX_DECIMAL_PRECISION
    if precision > MAX_DECIMAL_PRECISION:
        raise DecodeError(
            f"field {f.name!r} is numeric({precision},{scale}); Iceberg decimals hold at most "
            f"{MAX_DECIMAL_PRECISION} digits. Set the connector's decimal.handling.mode=string "
            "for this table."
        )
    if scale < 0:
        return min(MAX_DECIMAL_PRECISION, precision - scale), 0
    return max(precision, scale), scale


# ---- decoding expressions --------------------------------------------------------------


# PostgreSQL's ±infinity dates and timestamps arrive as these values (pgjdbc's
# DATE_POSITIVE/NEGATIVE_INFINITY for timestamps; what Debezium makes of LocalDate.MAX/MIN
# for dates). Iceberg has no infinity: they load as the ends of the range Spark and Iceberg
# share, the same values PostgreSQL's '9999-12-31 23:59:59.999999' and '0001-01-01' hold.
INFINITY_DAYS = (-2147472692, -2147472691)  # (+infinity, -infinity)
INFINITY_MILLIS = (9223372036825200, -9223372036832400)
INFINITY_MICROS = (9223372036825200000, -9223372036832400000)
LAKE_MAX_DATE, LAKE_MIN_DATE = "9999-12-31", "0001-01-01"
LAKE_MAX_TIMESTAMP = "9999-12-31 23:59:59.999999"
LAKE_MIN_TIMESTAMP = "0001-01-01 00:00:00"


def _infinity(col, values, decoded, kind: str):
    """`decoded`, with the connector's ±infinity `values` mapped to the ends of the range."""
    from pyspark.sql import functions as F

    top, bottom = (
        (LAKE_MAX_DATE, LAKE_MIN_DATE)
        if kind == "date"
        else (LAKE_MAX_TIMESTAMP, LAKE_MIN_TIMESTAMP)
    )
    return (
        F.when(col == F.lit(values[0]), F.lit(top).cast(kind))
        .when(col == F.lit(values[1]), F.lit(bottom).cast(kind))
        .otherwise(decoded)
    )


def decode_column(col, f: ConnectField):
    """Spark Column turning the parsed JSON value of `f` into its lake type."""
    from pyspark.sql import functions as F

    lg = f.logical
    if lg == DECIMAL:
        precision, scale = decimal_params(f)
        raw_scale = int(f.param("scale", "0") or 0)
        return decimal_from_base64(col, precision, raw_scale)
    if lg in (DATE, CONNECT_DATE):
        return _infinity(col, INFINITY_DAYS, F.date_from_unix_date(col), "date")
    if lg in (TIMESTAMP, CONNECT_TIMESTAMP):
        decoded = F.timestamp_millis(col).cast("timestamp_ntz")
        return _infinity(col, INFINITY_MILLIS, decoded, "timestamp_ntz")
    if lg == MICRO_TIMESTAMP:
        decoded = F.timestamp_micros(col).cast("timestamp_ntz")
        return _infinity(col, INFINITY_MICROS, decoded, "timestamp_ntz")
    if lg == NANO_TIMESTAMP:
        return F.timestamp_micros(F.floor(col / 1000)).cast("timestamp_ntz")
    if lg == ZONED_TIMESTAMP:
        decoded = col.cast("timestamp")
        values = ("infinity", "-infinity")
        top, bottom = LAKE_MAX_TIMESTAMP + "Z", LAKE_MIN_TIMESTAMP + "Z"
        return (
            F.when(col == values[0], F.to_timestamp(F.lit(top.replace(" ", "T"))))
            .when(col == values[1], F.to_timestamp(F.lit(bottom.replace(" ", "T"))))
            .otherwise(decoded)
        )
    if lg in (TIME, CONNECT_TIME):
        return time_text(col.cast("bigint") * 1000)
    if lg == MICRO_TIME:
        return time_text(col)
    if lg == NANO_TIME:
        return time_text(F.floor(col / 1000))
    if lg == VARIABLE_SCALE_DECIMAL:
        return variable_scale_text(col)
    if lg in (GEOMETRY, GEOGRAPHY):
        geo = F.struct(F.unbase64(col["wkb"]).alias("wkb"), col["srid"].alias("srid"))
        return F.when(col.isNotNull(), geo)
    if f.type == "bytes":
        return F.unbase64(col)
    if f.type in ("int8", "int16"):
        return col.cast("int")
    if f.type == "array" and f.items is not None:
        items = f.items
        if lake_type(items) == parse_type(items):
            return col
        return F.transform(col, lambda x: decode_column(x, items))
    if f.type == "map" and f.values is not None:
        values = f.values
        if lake_type(values) == parse_type(values):
            return col
        return F.transform_values(col, lambda _k, v: decode_column(v, values))
    return col


_TWO64 = "18446744073709551616"


def unscaled_from_base64(col):
    """Big-endian two's-complement bytes (base64) -> decimal(38,0), in the JVM.

    The bytes are sign-extended to 16, split into a signed high and an unsigned low
    64-bit half with `conv`, and recombined so no intermediate leaves decimal(38,0).
    """
    from pyspark.sql import functions as F

    hexed = F.hex(F.unbase64(col))
    negative = F.conv(F.substring(hexed, 1, 1), 16, 10).cast("int") >= 8
    pad = F.when(negative, F.lit("F")).otherwise(F.lit("0"))
    padded = F.when(F.length(hexed) == 0, F.lit("0" * 32)).otherwise(
        F.call_function("lpad", hexed, F.lit(32), pad)
    )
    hi = F.conv(F.substring(padded, 1, 16), 16, -10).cast("decimal(38,0)")
    lo = F.conv(F.substring(padded, 17, 16), 16, 10).cast("decimal(38,0)")
    two64 = F.lit(_TWO64).cast("decimal(38,0)")
    value = F.when(hi >= 0, hi * two64 + lo).otherwise((hi + 1) * two64 - (two64 - lo))
    return F.when(col.isNull(), F.lit(None)).otherwise(value.cast("decimal(38,0)"))


def variable_scale_text(col):
    """VariableScaleDecimal {scale, value} -> exact decimal text, any number of digits.

    Unconstrained numerics can exceed what a JVM decimal(38) holds, so this one type is
    decoded by a vectorised (Arrow batch) UDF with Python's arbitrary-size integers.
    """
    from pyspark.sql.functions import pandas_udf

    @pandas_udf("string")
    def decode(values):
        import base64

        import pandas as pd

        out = []
        for item in values.itertuples(index=False):
            scale, value = item.scale, item.value
            if value is None or pd.isna(value):
                out.append(None)
                continue
            unscaled = int.from_bytes(base64.b64decode(value), "big", signed=True)
            digits = str(abs(unscaled)).rjust(int(scale) + 1, "0")
            sign = "-" if unscaled < 0 else ""
            cut = len(digits) - int(scale)
            out.append(sign + (digits[:cut] + "." + digits[cut:] if scale > 0 else digits))
        return pd.Series(out)

    return decode(col)


def unscaled_digits(col):
    """Big-endian two's-complement bytes (base64) -> the signed integer as decimal text.

    Values of up to 8 bytes (every decimal of up to 18 digits) are sign-extended to 64
    bits and converted by one `conv`; longer ones go through `unscaled_from_base64`.
    """
    from pyspark.sql import functions as F

    hexed = F.hex(F.unbase64(col))
    negative = F.substring(hexed, 1, 1) >= F.lit("8")
    pad = F.when(negative, F.lit("F")).otherwise(F.lit("0"))
    short = F.conv(F.call_function("lpad", hexed, F.lit(16), pad), 16, -10)
    return F.when(F.length(hexed) <= 16, short).otherwise(unscaled_from_base64(col).cast("string"))


def decimal_from_base64(col, precision: int, scale: int):
    """Connect Decimal (unscaled bytes, base64) -> decimal(precision, scale), exactly:
    the digits with an exponent (`12345E-2`) cast to the decimal type. A value that does
    not fit the type becomes NULL (which the decoding reports as a column that does not
    fit)."""
    from pyspark.sql import functions as F

    text = F.concat(unscaled_digits(col), F.lit(f"E{-scale}"))
    return text.cast(f"decimal({precision},{max(scale, 0)})")


def time_text(micros):
    """Microseconds since midnight -> 'HH:MM:SS.ffffff' (24:00:00 stays 24:00:00)."""
    from pyspark.sql import functions as F

    def two(x):
        return F.lpad(x.cast("string"), 2, "0")

    hours = F.floor(micros / 3_600_000_000)
    minutes = F.floor(micros / 60_000_000) % 60
    seconds = F.floor(micros / 1_000_000) % 60
    frac = F.lpad((micros % 1_000_000).cast("string"), 6, "0")
    text = F.concat(
        two(hours), F.lit(":"), two(minutes), F.lit(":"), two(seconds), F.lit("."), frac
    )
    return F.when(micros.isNull(), F.lit(None)).otherwise(text)
