"""The reader's raw rows: each Kafka record split into its key and value schema (by id, the
text sent once per task) and payload text, gathered into Arrow batches (`RawRows`); a
record that is not a JSON-with-schema envelope is kept with its error."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

if TYPE_CHECKING:
    import pyarrow as pa


# The raw record rows the reader yields: (name, Spark type, Arrow type name), one list.
_FIELDS = [
    ("topic", "string", "string"),
    ("partition", "int", "int32"),
    ("offset", "long", "int64"),
    ("timestamp", "long", "int64"),
    ("key_schema_id", "long", "int64"),
    ("key_schema", "string", "string"),
    ("key_payload", "string", "string"),
    ("value_schema_id", "long", "int64"),
    ("value_schema", "string", "string"),
    ("value_payload", "string", "string"),
    ("is_tombstone", "boolean", "bool_"),
    # records are missing right before this one, and the one before it is of another key:
    # a compacted topic's log cleaner removed them (or transaction markers stand there)
    ("follows_gap", "boolean", "bool_"),
    ("error", "string", "string"),
    # the record's headers cdclake reads (`kept_headers`), as one JSON object
    ("headers", "string", "string"),
]
RAW_SCHEMA = ", ".join(f"{name} {spark_type}" for name, spark_type, _ in _FIELDS)
RAW_FIELD_NAMES = [name for name, _, _ in _FIELDS]
_HEAD = b'{"schema":'
# what a JSON object without its schema is told: most likely the converter's setting
_SCHEMALESS = (
    "; JSON without schemas? Set key.converter.schemas.enable and "
    "value.converter.schemas.enable to true on the connector"
)
_SEP = b',"payload":'
_NOT_ENVELOPE = 'not a JSON-with-schema envelope ({"schema":...,"payload":...})'
OLD_KEY_HEADER = "__debezium.oldkey"  # the key a primary-key change's create had
NEW_KEY_HEADER = "__debezium.newkey"  # the key a primary-key change's delete moved to
# ExtractNewRecordState's `add.headers`: a flattened change's metadata as headers
META_HEADERS = ("__op", "__lsn", "__source_ts_ms")
_KEPT = frozenset((OLD_KEY_HEADER, NEW_KEY_HEADER, *META_HEADERS))


# a column of records' values: an Arrow array (chunked or not) or a list
Values: TypeAlias = "pa.Array | pa.ChunkedArray | Sequence[Any]"
# one side of records a reader split: each one's payload text, the key of its schema
# text (null: no data on this side), and the schema texts by key
Split: TypeAlias = "tuple[pa.Array, pa.Array, Mapping[int, bytes]]"


class RawRowsWriter(Protocol):
    """A reader task's records of one partition, split into the raw rows
    (`cdclake.raw_rows.RAW_SCHEMA`), gathered into Arrow batches."""

    def __len__(self) -> int: ...

    def add_many(
        self,
        offsets: Values,
        timestamps: Values,
        keys: Values,
        values: Values,
        headers: Values | None = None,
    ) -> None: ...

    def batch(self) -> pa.RecordBatch: ...


def kept_headers(headers: Iterable[tuple[str, bytes | None]] | None) -> str | None:
    """The headers cdclake reads of a record's (name, value) pairs, as Kafka's client or
    the dead-letter table gives them: one JSON object of their texts, None without any."""
    import json

    found = {
        name: value.decode("utf-8", "replace")
        for name, value in headers or ()
        if name in _KEPT and value is not None
    }
    return json.dumps(found, separators=(",", ":")) if found else None


def header_values(text: str | None) -> dict[str, str]:
    """The headers of a raw row's `headers` text, by name."""
    import json

    return {} if text is None else json.loads(text)


def split_envelope(data: bytes) -> tuple[bytes, bytes] | None:
    """Split `{"schema":S,"payload":P}` into (S, P); None for `{"schema":null,"payload":null}`,
    which Kafka Connect's JsonConverter reads as a null value.

    The converter writes the payload as the envelope's last field, and the schema part only
    has the fixed keys of a Kafka Connect schema, so the first `,"payload":` is the boundary
    and P is not parsed. Any other valid JSON (whitespace, another key order) is parsed."""
    if data.startswith(_HEAD) and data.endswith(b"}"):
        cut = data.find(_SEP)
        if cut >= 0:
            schema, payload = data[len(_HEAD) : cut], data[cut + len(_SEP) : -1]
            return None if schema == payload == b"null" else (schema, payload)
    return _parse_envelope(data)


def _parse_envelope(data: bytes) -> tuple[bytes, bytes] | None:
    """`split_envelope` of an envelope the byte split does not take, by a JSON parser."""
    import json

    try:
        envelope = json.loads(data)
    except ValueError as exc:  # UnicodeDecodeError included
        raise ValueError(f"{_NOT_ENVELOPE}: not valid JSON ({exc})") from exc
    if not isinstance(envelope, dict) or not {"schema", "payload"} <= envelope.keys():
        hint = _SCHEMALESS if isinstance(envelope, dict) and "schema" not in envelope else ""
        raise ValueError(f"{_NOT_ENVELOPE}{hint}")
    schema, payload = envelope["schema"], envelope["payload"]
    if schema is None and payload is None:
        return None

    def text(part: object) -> bytes:
        return json.dumps(part, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    return text(schema), text(payload)


def schema_id(schema: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(schema, digest_size=8).digest(), "big", signed=True)


class SchemaIds:
    """The schemas one reader task has met: each one's id, and which were sent already.

    Consecutive records nearly always share their schema, so a schema equal to the last
    one of its side (a memcmp) takes that one's id without hashing its ~3 KB again."""

    def __init__(self) -> None:
        self.sent: set[int] = set()
        self.last: dict[str, tuple[bytes, int]] = {}  # per side: its last schema and id

    def id_of(self, side: str, schema: bytes) -> tuple[int, bool]:
        """The schema's id, and whether this is the first record of the task with it."""
        last = self.last.get(side)
        if last is not None and last[0] == schema:
            return last[1], False
        sid = schema_id(schema)
        self.last[side] = (schema, sid)
        first = sid not in self.sent
        self.sent.add(sid)
        return sid, first


def raw_arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, arrow)()) for name, _, arrow in _FIELDS])


def record_row(
    seen: SchemaIds,
    topic: str,
    partition: int,
    offset: int,
    timestamp: int,
    key: bytes | None,
    value: bytes | None,
    headers: str | None = None,
) -> dict[str, object]:
    """One raw row: the record split into schema id, schema text (first time only) and
    payload per side; an envelope that cannot be split is kept with its error."""
    row: dict[str, object] = {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "timestamp": timestamp,
        "is_tombstone": value is None,
        "follows_gap": False,
        "error": None,
        "headers": headers,
    }
    for side, data in (("key", key), ("value", value)):
        row[f"{side}_schema_id"] = row[f"{side}_schema"] = row[f"{side}_payload"] = None
        if data is None:
            continue
        try:
            split = split_envelope(data)
            if split is None:  # the converter's null: a tombstone (a value) or no key
                row["is_tombstone"] = row["is_tombstone"] or side == "value"
                continue
            schema, payload = split
            row[f"{side}_payload"] = payload.decode("utf-8")
            sid, first = seen.id_of(side, schema)
            row[f"{side}_schema_id"] = sid
            if first:
                row[f"{side}_schema"] = schema.decode("utf-8")
        except (ValueError, UnicodeDecodeError) as exc:
            row["error"] = f"{side}: {exc}"
    return row


class RawRows:
    """The raw rows of one reader task, gathered into Arrow batches.

    `add_many` splits each run of records whose key and value each have the schema of
    the last record that had one (nearly every record) with Arrow compute functions, by
    comparing the start of their bytes with that envelope's `{"schema":S,"payload":`;
    any other record goes through `record_row` (`add`). Both give the same rows (a unit
    test checks them side by side)."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self.seen = SchemaIds()
        # per side: the envelope head of its last schema, and that schema's id
        self._head: dict[str, tuple[bytes, int] | None] = {"key": None, "value": None}
        self._cols: dict[str, list[Any]] = {name: [] for name in RAW_FIELD_NAMES}
        self._done: list[pa.RecordBatch] = []  # batches of rows before those in `_cols`
        self._rows = 0

    def __len__(self) -> int:
        return self._rows

    def add(
        self,
        offset: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: str | None = None,
    ) -> None:
        """One record, split by `record_row`; its schemas become the last ones."""
        self._rows += 1
        self._add_row(
            record_row(
                self.seen, self.topic, self.partition, offset, timestamp, key, value, headers
            )
        )
        for side, (schema, sid) in self.seen.last.items():
            self._head[side] = (_HEAD + schema + _SEP, sid)

    def add_error(
        self,
        offset: int,
        timestamp: int,
        is_tombstone: bool,
        error: str,
        headers: str | None = None,
    ) -> None:
        """A record another converter's reader could not read, kept with why (its bytes
        are read again from Kafka if it goes to the dead letters)."""
        self._rows += 1
        row = record_row(
            self.seen, self.topic, self.partition, offset, timestamp, None, None, headers
        )
        row.update(is_tombstone=is_tombstone, error=error)
        self._add_row(row)

    def add_many(
        self,
        offsets: Values,
        timestamps: Values,
        keys: Values,
        values: Values,
        headers: Values | None = None,
    ) -> None:
        """`add` of each record, in order, from Arrow arrays (or lists; `headers`: each
        record's `kept_headers`): each run of records that split with the last schemas is
        split by Arrow compute functions."""
        import pyarrow as pa

        offsets, timestamps = arrow_array(offsets, pa.int64()), arrow_array(timestamps, pa.int64())
        keys, values = arrow_array(keys, pa.binary()), arrow_array(values, pa.binary())
        heads = (
            pa.nulls(len(offsets), pa.string())
            if headers is None
            else arrow_array(headers, pa.string())
        )
        start, n = 0, len(offsets)
        while start < n:
            end = self._run(keys, values, start)
            if end > start:
                self._add_run(offsets, timestamps, keys, values, heads, start, end)
                start = end
            if start < n:  # another schema or no envelope: one at a time
                self.add(
                    offsets[start].as_py(),
                    timestamps[start].as_py(),
                    keys[start].as_py(),
                    values[start].as_py(),
                    heads[start].as_py(),
                )
                start += 1

    def add_split(
        self,
        offsets: pa.Array,
        timestamps: pa.Array,
        sides: Mapping[str, Split],
        is_tombstone: pa.Array,
        headers: pa.Array,
    ) -> None:
        """Records another converter's reader split already: per side, each record's
        payload text and the key of its schema text in the `Split`'s schemas (null
        where the record has no data on that side)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        cols: dict[str, Any] = {}
        for side, (payloads, keys, schemas) in sides.items():
            present = pc.unique(keys.drop_null()).to_pylist()
            ids = {key: self.seen.id_of(side, schemas[key]) for key in present}
            at = pc.index_in(keys, value_set=pa.array(present, pa.int64()))
            cols[f"{side}_schema_id"] = pa.array([ids[k][0] for k in present], pa.int64()).take(at)
            texts: list[str | None] = [None] * len(keys)
            for key, (_, first) in ids.items():
                if first:  # the task's first record with it carries its text
                    texts[pc.index(keys, key).as_py()] = schemas[key].decode("utf-8")
            cols[f"{side}_schema"] = pa.array(texts, pa.string())
            cols[f"{side}_payload"] = payloads
        self._append(offsets, timestamps, cols, is_tombstone, headers)

    def _run(self, keys: pa.Array, values: pa.Array, start: int) -> int:
        """The end of the run of records from `start` that split with the last schemas."""
        import pyarrow.compute as pc

        ok = None
        for side, data in (("key", keys), ("value", values)):
            data = data.slice(start)
            head = self._head[side]
            if head is None:
                fits = pc.is_null(data)
            else:
                fits = pc.and_kleene(
                    pc.starts_with(data, pattern=head[0]), pc.ends_with(data, pattern="}")
                )
                fits = pc.fill_null(fits, True)  # no data: nothing to split
            ok = fits if ok is None else pc.and_(ok, fits)
        bad = pc.index(ok, False).as_py()
        return len(keys) if bad < 0 else start + bad

    def _add_run(
        self,
        offsets: pa.Array,
        timestamps: pa.Array,
        keys: pa.Array,
        values: pa.Array,
        heads: pa.Array,
        start: int,
        end: int,
    ) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        n = end - start
        cols: dict[str, pa.Array] = {}
        for side, data in (("key", keys), ("value", values)):
            data = data.slice(start, n)
            head = self._head[side]
            cols[f"{side}_schema"] = pa.nulls(n, pa.string())
            if head is None:  # every record of the run has no data on this side
                cols[f"{side}_schema_id"] = pa.nulls(n, pa.int64())
                cols[f"{side}_payload"] = pa.nulls(n, pa.string())
                continue
            valid = pc.is_valid(data)
            cols[f"{side}_schema_id"] = pc.if_else(
                valid, pa.scalar(head[1], pa.int64()), pa.scalar(None, pa.int64())
            )
            try:
                payload = pc.binary_slice(data, len(head[0]), -1).cast(pa.string())
            except pa.ArrowInvalid:  # not UTF-8: the records go one at a time
                for i in range(start, end):
                    self.add(
                        offsets[i].as_py(),
                        timestamps[i].as_py(),
                        keys[i].as_py(),
                        values[i].as_py(),
                        heads[i].as_py(),
                    )
                return
            cols[f"{side}_payload"] = payload
        self._append(
            offsets.slice(start, n),
            timestamps.slice(start, n),
            cols,
            pc.is_null(values.slice(start, n)),
            heads.slice(start, n),
        )

    def _append(
        self,
        offsets: pa.Array,
        timestamps: pa.Array,
        sides: dict[str, pa.Array],
        is_tombstone: pa.Array,
        headers: pa.Array,
    ) -> None:
        """A batch of split records (`sides`: each side's schema id, schema and payload
        columns) after the rows gathered before them."""
        import numpy as np
        import pyarrow as pa

        n = len(offsets)
        cols = {
            "topic": pa.array([self.topic] * n, pa.string()),
            "partition": pa.array([self.partition] * n, pa.int32()),
            "offset": offsets,
            "timestamp": timestamps,
            **sides,
            "is_tombstone": is_tombstone,
            "follows_gap": pa.array(np.zeros(n, bool)),  # the reader sets it (`_read_slice`)
            "error": pa.nulls(n, pa.string()),
            "headers": headers,
        }
        self._flush()
        self._done.append(pa.RecordBatch.from_pydict(cols, schema=raw_arrow_schema()))
        self._rows += n

    def _add_row(self, row: dict[str, object]) -> None:
        for name, values in self._cols.items():
            values.append(row[name])

    def _flush(self) -> None:
        """The rows in `_cols` into a batch of `_done`."""
        import pyarrow as pa

        if self._cols["offset"]:
            self._done.append(pa.RecordBatch.from_pydict(self._cols, schema=raw_arrow_schema()))
            self._cols = {name: [] for name in RAW_FIELD_NAMES}

    def batch(self) -> pa.RecordBatch:
        """The rows gathered since the last batch, as one Arrow batch."""
        import pyarrow as pa

        self._flush()
        done, self._done, self._rows = self._done, [], 0
        if not done:
            return pa.RecordBatch.from_pydict(self._cols, schema=raw_arrow_schema())
        if len(done) == 1:
            return done[0]
        return pa.Table.from_batches(done).combine_chunks().to_batches()[0]


def arrow_array(values: Values, kind: pa.DataType) -> pa.Array:
    """`values` as one Arrow array of `kind`."""
    import pyarrow as pa

    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    return values if isinstance(values, pa.Array) else pa.array(values, kind)
