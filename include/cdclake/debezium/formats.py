"""Debezium wire formats: what a Kafka Connect converter writes, read into changes.

`WireFormat` names the formats cdclake reads, and a pipeline picks one (`kafka.format`):
a converter (JSON, or Avro with a schema registry) and a shape (the whole envelope, or
flattened), each shape one module with the functions of `Codec`. The reader splits each
record with the format's `raw_rows` into schema ids, schema text and payload (an Avro
record as the JSON converter would have written it); the batch's topic shape
comes from the row fields of its schemas (`key_fields`, `value_fields`); DuckDB decodes
the raw rows into a table of changes (`cdclake.debezium.json_decode.decoded`), a reason
beside each record that cannot be applied. Everything after that table (the CDC rules,
the MERGE) is the same for every format.
"""

from __future__ import annotations

import importlib
from enum import StrEnum
from typing import Any, Protocol

from cdclake.raw_rows import RawRowsWriter

# In `Codec`, a `schema` is the topic's `cdclake.debezium.schema.TopicSchema` (which names
# its format, so this module imports no other of cdclake's but the raw rows' shape).


class Unsupported(Exception):
    """What a fold cannot take (the message says why)."""


class BadRecord(Unsupported):
    """A record that cannot be applied (the message says why)."""


class Codec(Protocol):
    """What a format's module provides."""

    def key_fields(self, text: str) -> tuple[Any, ...]:
        """A key schema (its text in the raw rows): its fields, the key columns
        (`cdclake.debezium.connect.ConnectField`s)."""

    def value_fields(self, text: str, where: str) -> tuple[Any, ...]:
        """A value schema: the fields of the rows it carries; `DecodeError` (naming
        `where`) for a schema that is not of this format."""


class WireFormat(StrEnum):
    """The converter (and transforms) the topics were written with: the converter reads
    a record's bytes (`raw_rows`), the record's shape picks the codec."""

    JSON = "json"  # JsonConverter with schemas.enable=true, the whole change envelope
    # the same converter, records flattened by ExtractNewRecordState with
    # add.fields=op,lsn,source.ts_ms and deletes kept (`debezium/json_flat`)
    JSON_FLAT = "json-flat"
    # an Avro converter writing the Confluent wire format to a schema registry
    # (`debezium/avro`): the same two shapes
    AVRO = "avro"
    AVRO_FLAT = "avro-flat"

    @property
    def flat(self) -> bool:
        return self in (WireFormat.JSON_FLAT, WireFormat.AVRO_FLAT)

    @property
    def codec(self) -> Codec:
        return importlib.import_module(_FLAT if self.flat else _ENVELOPE)

    @property
    def avro(self) -> bool:
        return self in (WireFormat.AVRO, WireFormat.AVRO_FLAT)

    def raw_rows(self, topic: str, partition: int, registry: Any = None) -> RawRowsWriter:
        """The splitter of one reader task's records (`registry`: the
        `cdclake.debezium.registry.RegistryConfig` of an Avro format)."""
        if self.avro:
            writer: RawRowsWriter = importlib.import_module(_AVRO).AvroRawRows(
                topic, partition, registry
            )
            return writer
        rows: RawRowsWriter = importlib.import_module(_JSON).RawRows(topic, partition)
        return rows


_ENVELOPE, _FLAT = "cdclake.debezium.json_records", "cdclake.debezium.json_flat"
_JSON, _AVRO = "cdclake.raw_rows", "cdclake.debezium.avro"
