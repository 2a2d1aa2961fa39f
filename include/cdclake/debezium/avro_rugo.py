"""An Avro schema's datums read together by rugo (C++): framed as an Avro container file,
a block a datum, whose record has the datum as its one field (`v`), which rugo gives as
JSON text, the JSON converter's payload. A block a datum makes rugo check that each datum
ends where its bytes do. rugo writes NaN and infinities as null and -0.0 as 0: the rows
with such a float (read as typed columns) are left to be read alone, and so is each datum
of a run rugo refuses, halved until it is at most `ALONE` datums (rugo's errors name no
datum)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

_SYNC = bytes(16)  # the container's sync marker (any 16 bytes do)
ALONE = 64  # a refused run of no more datums is read datum by datum


def payload_texts(head: bytes, floats: tuple[str, ...], datums: pa.Array) -> pa.Array:
    """The payload texts (JSON) of `datums` (binary, of the schema `container` gave
    `head` and `floats` for); null for each datum to be read alone."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(datums)
    try:
        blob = _framed(head, datums)
        texts = _read(blob, ["v"]).column("v")
        if len(texts) != n:
            raise ValueError(f"{len(texts)} rows of {n} datums")
        special = np.zeros(n, bool)
        for column in _read(blob, list(floats)).columns if floats else ():
            special |= _special_floats(column, n)
    except Exception:  # rugo's errors name no datum: each half again
        if n <= ALONE:
            return pa.nulls(n, pa.string())
        half = n // 2
        return pa.concat_arrays(
            [
                payload_texts(head, floats, datums.slice(0, half)),
                payload_texts(head, floats, datums.slice(half)),
            ]
        )
    texts = texts.combine_chunks()
    if special.any():
        texts = pc.if_else(pa.array(~special), texts, pa.scalar(None, pa.string()))
    return texts


def _framed(head: bytes, datums: pa.Array) -> bytes:
    """The container file of the datums, a block each: its count (1), its size as a
    5-byte varint (a long may take more bytes than it needs), the datum, the marker."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(datums)
    size = pc.binary_length(datums).to_numpy(zero_copy_only=False).astype(np.int64) << 1
    prefix = np.empty((n, 6), np.uint8)
    prefix[:, 0] = 2  # zigzag 1
    for k in range(5):
        prefix[:, 1 + k] = ((size >> (7 * k)) & 0x7F) | (0x80 if k < 4 else 0)
    prefixes = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(6), n, [None, pa.py_buffer(prefix.tobytes())]
    ).cast(pa.binary())
    sync = pa.scalar(_SYNC, pa.binary())
    blocks = pc.binary_join_element_wise(prefixes, datums, sync, pa.scalar(b"", pa.binary()))
    offsets = np.frombuffer(blocks.buffers()[1], np.int32)
    body = memoryview(blocks.buffers()[2]).cast("B")[offsets[0] : offsets[n]]
    return b"".join([head, body])


def container(plain: Any) -> tuple[bytes | None, tuple[str, ...]]:
    """The head of the container file rugo reads a record schema's datums from, the
    datum the one field (`v`) of its record, and the columns of its floats (`v.after.x`,
    an array of floats too); no head for a schema that is not a record, is recursive,
    or has floats rugo can only give as JSON text (in a map or an array of records)."""
    named = _named(plain, {})
    floats: list[str] = []

    def typed(avro: Any, path: str, seen: frozenset[str]) -> bool:
        """Whether each float of `avro` (a value at `path`) is a column rugo types."""
        avro = named.get(avro, avro) if isinstance(avro, str) else avro
        if isinstance(avro, list):
            return all(typed(branch, path, seen) for branch in avro)
        kind = avro if isinstance(avro, str) else avro["type"]
        if isinstance(kind, (dict, list)):
            return typed(kind, path, seen)
        if kind in ("float", "double"):
            floats.append(path)
        elif kind == "record":
            if avro["name"] in seen:
                return False
            inner = seen | {avro["name"]}
            return all(typed(f["type"], f"{path}.{f['name']}", inner) for f in avro["fields"])
        elif kind == "array" and _floats(avro["items"], named, frozenset()):
            items = avro["items"] if isinstance(avro["items"], list) else [avro["items"]]
            floats.append(path)
            return {branch for branch in items if branch != "null"} in ({"float"}, {"double"})
        elif kind == "map":
            return not _floats(avro["values"], named, frozenset())
        return True

    if not isinstance(plain, dict) or plain.get("type") != "record":
        return None, ()
    if not typed(plain, "v", frozenset()):
        return None, ()
    datum = {
        "type": "record",
        "name": "cdclake.avro.Datum",
        "fields": [{"name": "v", "type": plain}],
    }
    meta = {b"avro.schema": json.dumps(datum).encode(), b"avro.codec": b"null"}
    head = b"Obj\x01" + _long(len(meta))
    head += b"".join(_long(len(k)) + k + _long(len(v)) + v for k, v in meta.items())
    return head + _long(0) + _SYNC, tuple(floats)


def _named(avro: Any, found: dict[str, Any]) -> dict[str, Any]:
    """The named types an Avro schema defines, by full name and by name."""
    if isinstance(avro, list):
        for branch in avro:
            _named(branch, found)
    elif isinstance(avro, dict):
        if avro.get("type") in ("record", "enum", "fixed"):
            name = avro["name"]
            full = name if "." in name else f"{avro.get('namespace', '')}.{name}".lstrip(".")
            found[full] = found[full.rpartition(".")[2]] = avro
        for part in (avro.get("type"), avro.get("items"), avro.get("values")):
            _named(part, found)
        for field in avro.get("fields", ()):
            _named(field["type"], found)
    return found


def _floats(avro: Any, named: dict[str, Any], seen: frozenset[str]) -> bool:
    """Whether a value of the Avro type can hold a float."""
    if isinstance(avro, str):
        if avro in ("float", "double"):
            return True
        return avro in named and avro not in seen and _floats(named[avro], named, seen | {avro})
    if isinstance(avro, list):
        return any(_floats(branch, named, seen) for branch in avro)
    parts = [avro["type"], avro.get("items"), avro.get("values")]
    parts += [field["type"] for field in avro.get("fields", ())]
    return any(_floats(part, named, seen) for part in parts if part is not None)


def _long(n: int) -> bytes:
    """Avro's long: zigzag, then 7 bits a byte."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read(blob: bytes, columns: list[str]) -> pa.Table:
    """The columns of the container file's records."""
    import pyarrow as pa
    from rugo import avro as rugo_avro

    with rugo_avro.read_avro(blob, columns=columns, max_threads=1) as reader:
        return pa.concat_tables([morsel.to_arrow() for morsel in reader])


def _special_floats(column: pa.ChunkedArray, rows: int) -> Any:
    """Which rows hold a float rugo writes otherwise than the JSON converter does: NaN,
    an infinity (as null) or -0.0 (as 0)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    values = column.combine_chunks()
    at = None
    if pa.types.is_list(values.type):
        at = pc.list_parent_indices(values).to_numpy()
        values = pc.list_flatten(values)
    x = pc.fill_null(values, 1.0).to_numpy(zero_copy_only=False)
    special = ~np.isfinite(x) | ((x == 0) & np.signbit(x))
    rows_of = np.zeros(rows, bool)
    rows_of[special.nonzero()[0] if at is None else at[special]] = True
    return rows_of
