"""Debezium wire formats: what a Kafka Connect converter writes, read into changes.

`WireFormat` names the formats cdclake reads, and a pipeline picks one (`kafka.format`):
a converter (JSON, or Avro with a schema registry) and a shape (the whole envelope, or
flattened), each shape one module with the functions of `Codec`. The reader splits each
record with the format's `raw_rows` into schema ids, schema text and payload (an Avro
record as the JSON converter would have written it); the batch's topic shape
comes from the row fields of its schemas (`key_fields`, `value_fields`); the folds decode
raw rows into `Change`s with `decode_records`, which raises `BadRecord` for a record that
cannot be applied. Everything after a `Change` (the CDC rules, the MERGE) is the same
for every format.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

# In `Codec`, a `schema` is the topic's `cdclake.debezium.schema.TopicSchema` (which names
# its format, so this module imports no other of cdclake's).


class Unsupported(Exception):
    """What a fold cannot take (the message says why)."""


class BadRecord(Unsupported):
    """A record that cannot be applied (the message says why)."""


@dataclass(slots=True)
class Change:
    """One record, decoded: what the CDC rules read."""

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
    # what decodes the rest of its rows when it is settled (the format's own object, with
    # a `settle(change)` method), None once they are
    pending: Any = None
    # a create of a key that was another's (a primary-key change): that key's values, from
    # the record's `__debezium.oldkey` header
    from_key: tuple | None = None


def settle(change: Change) -> Change:
    """The change with every column of its rows decoded."""
    rows = change.pending
    if rows is not None:
        change.pending = None
        rows.settle(change)
    return change


def by_column(rows: Sequence[dict | None], names: Iterable[str]) -> dict[str, list]:
    """Decoded rows (None: no row, all its values None) as the values of each column
    named."""
    return {name: [None if r is None else r.get(name) for r in rows] for name in names}


class RawRowsWriter(Protocol):
    """A reader task's records of one partition, split into the raw rows
    (`cdclake.kafka.raw_rows.RAW_SCHEMA`), gathered into Arrow batches."""

    def __len__(self) -> int: ...

    def add_many(self, offsets, timestamps, keys, values, headers=None) -> None: ...

    def batch(self) -> pa.RecordBatch: ...


class Codec(Protocol):
    """What a format's module provides."""

    def key_fields(self, text: str) -> tuple[Any, ...]:
        """A key schema (its text in the raw rows): its fields, the key columns
        (`cdclake.debezium.connect.ConnectField`s)."""

    def value_fields(self, text: str, where: str) -> tuple[Any, ...]:
        """A value schema: the fields of the rows it carries; `DecodeError` (naming
        `where`) for a schema that is not of this format."""

    def row_decoders(self, schema: Any, key_schemas: Mapping[int, str],
                     value_schemas: Mapping[int, str]) -> Any:  # fmt: skip
        """What `decode_records` needs of the schemas, built once per topic and task."""

    def decode_records(
        self, rows: pa.Table | pa.RecordBatch, schema: Any,
        key_schemas: Mapping[int, str], value_schemas: Mapping[int, str],
        decoders: Any = None, headers_only: bool = False,
    ) -> list[Change]:  # fmt: skip
        """Raw rows of one topic -> one change per record; `BadRecord` for a record that
        cannot be applied. `headers_only`: rows decoded only when the change is settled."""


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
        return importlib.import_module(_FLAT if self.flat else _ENVELOPE)  # type: ignore[return-value]

    @property
    def avro(self) -> bool:
        return self in (WireFormat.AVRO, WireFormat.AVRO_FLAT)

    def raw_rows(self, topic: str, partition: int, registry: Any = None) -> RawRowsWriter:
        """The splitter of one reader task's records (`registry`: the
        `cdclake.debezium.registry.RegistryConfig` of an Avro format)."""
        if self.avro:
            return importlib.import_module(_AVRO).AvroRawRows(topic, partition, registry)
        return importlib.import_module(_JSON).RawRows(topic, partition)


_ENVELOPE, _FLAT = "cdclake.debezium.json_records", "cdclake.debezium.json_flat"
_JSON, _AVRO = "cdclake.kafka.raw_rows", "cdclake.debezium.avro"
