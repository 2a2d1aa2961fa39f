"""The JSON-with-schema wire format (`WireFormat.JSON`, the `Codec` of
`cdclake.debezium.formats`): each record a whole change event envelope. The reader splits
each envelope into its schema and payload text (`cdclake.raw_rows`); the schemas give
the topic's columns (`key_fields`, `value_fields`) and DuckDB reads the payloads
(`cdclake.debezium.json_decode`)."""

from __future__ import annotations

from cdclake.debezium.connect import ConnectField, parse_connect_schema
from cdclake.debezium.schema import value_row_fields


def key_fields(text: str) -> tuple[ConnectField, ...]:
    """A key schema's fields (the key columns)."""
    return parse_connect_schema(text).fields


def value_fields(text: str, where: str) -> tuple[ConnectField, ...]:
    """A value schema's row fields: its envelope's `after` (DecodeError: no envelope)."""
    return value_row_fields(parse_connect_schema(text), where)
