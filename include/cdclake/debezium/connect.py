"""Debezium / Kafka Connect JSON schemas: what a field is, which lossless
Iceberg-compatible type it becomes in the lake, and that type's Arrow form."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from cdclake.exceptions import DecodeError

if TYPE_CHECKING:
    import pyarrow as pa

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
        schema = cast(Mapping[str, Any], json.loads(schema))
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

# the lake types of the Connect types without a logical type or nested values
_LAKE_TYPES = {
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
    "bytes": "binary",
}


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
    if f.type == "array" and f.items is not None:
        return f"array<{lake_type(f.items)}>"
    if f.type == "map" and f.values is not None:
        return f"map<string,{lake_type(f.values)}>"
    if f.type == "struct":
        return "string"  # kept as its JSON text
    try:
        return _LAKE_TYPES[f.type]
    except KeyError:
        raise DecodeError(f"field {f.name!r} has unknown Connect type {f.type!r}") from None


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
        "int": pa.int32(),
        "bigint": pa.int64(),
        "float": pa.float32(),
        "double": pa.float64(),
        "boolean": pa.bool_(),
        "string": pa.string(),
        "binary": pa.binary(),
        "date": pa.date32(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "timestamp_ntz": pa.timestamp("us"),
    }
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
