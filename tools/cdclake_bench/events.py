"""Expand captured connector records into a benchmark workload.

Each stream (one topic, fed by one table's templates) gets its share of the events over
its share of the keys, spread over the topic's partitions by key. Per key the operations
follow a row's life: the first change is an insert (`c`), then updates (`u`), sometimes a
delete (`d` followed by its tombstone), after which the key may be inserted again. Plain
text columns get fresh text of the template's length, and every record gets its own key,
LSN, transaction id and timestamps; the schema part stays byte for byte the connector's.

Generation is deterministic per (topic, partition, first offset), so the same slice can be
recorded to a file on the driver or regenerated inside a Spark executor.
"""

from __future__ import annotations

import json
import random
import re
import string
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from cdclake.resolve.rules import TOAST_PLACEHOLDER

from cdclake_bench.templates import SCHEMA, TABLES, Template, load_templates

_SENTINEL = re.compile(r'"@@(\w+)@@"')
_ALPHABET = string.ascii_letters + string.digits + "      "
POOL = 512  # distinct texts per column


@dataclass(frozen=True)
class Stream:
    topic: str
    table: str  # which template table feeds it


@dataclass(frozen=True)
class Workload:
    events: int  # Kafka records in all streams (tombstones count)
    keys: int  # distinct keys in all streams
    streams: tuple[Stream, ...]
    partitions: int = 2
    delete_share: float = 0.1  # of changes to a live key
    seed: int = 7
    # of updates, the share that leaves the longest text column alone: the connector
    # then sends a TOAST placeholder for it (a value PostgreSQL stores out of line)
    toast_share: float = 0.0

    @classmethod
    def standard(cls, events: int, keys: int, prefix: str = "bench", tables: int = 3,
                 partitions: int = 2) -> Workload:  # fmt: skip
        """`tables` topics named <prefix>.inventory.<table>, cycling over the templates."""
        streams = tuple(
            Stream(f"{prefix}.{SCHEMA}.{TABLES[i % len(TABLES)]}"
                   + ("" if tables <= len(TABLES) else f"_{i}"), TABLES[i % len(TABLES)])
            for i in range(tables)
        )  # fmt: skip
        return cls(events, keys, streams, partitions)

    def slices(self) -> list[tuple[str, int, int]]:
        """(topic, partition, records) for every topic-partition."""
        n = len(self.streams) * self.partitions
        out = []
        for i, s in enumerate(self.streams):
            for p in range(self.partitions):
                j = i * self.partitions + p
                out.append((s.topic, p, self.events // n + (1 if j < self.events % n else 0)))
        return out

    def table_of(self, topic: str) -> str:
        return next(s.table for s in self.streams if s.topic == topic)

    def keys_of(self, topic: str, partition: int) -> range:
        """The keys of one topic-partition (key % partitions == partition), from 1."""
        per_stream = max(1, self.keys // len(self.streams))
        first = partition if partition > 0 else self.partitions
        return range(first, per_stream + 1, self.partitions)


@dataclass
class _Shape:
    """A record template cut into literal parts and named holes."""

    key_parts: list[str]
    value_head: bytes  # b'{"schema":...,"payload":'
    value_parts: list[str]
    texts: dict[str, int] = field(default_factory=dict)  # hole -> text length


def _cut(text: str) -> list[str]:
    return _SENTINEL.split(text)  # literal, hole, literal, hole, ...


def _shape(t: Template) -> _Shape:
    key = json.loads(t.key)
    key["payload"] = {k: "@@ID@@" for k in key["payload"]}
    key_parts = _cut(json.dumps(key, separators=(",", ":"), ensure_ascii=False))
    if t.value is None:
        return _Shape(key_parts, b"", [])
    raw = t.value.encode()
    head = raw[: raw.index(b',"payload":') + len(b',"payload":')]
    payload = json.loads(t.value)["payload"]
    texts: dict[str, int] = {}
    for side in ("before", "after"):
        row = payload.get(side)
        if row is None:
            continue
        for name, value in row.items():
            if name == "id":
                row[name] = "@@ID@@"
            elif isinstance(value, str) and len(value) >= 20 and " " in value and value[0] != "{":
                hole = f"T_{name}"
                texts[hole] = len(value)
                row[name] = f"@@{hole}@@"
    payload["ts_ms"] = "@@TS@@"
    src = payload["source"]
    src.update(ts_ms="@@TS@@", lsn="@@LSN@@", txId="@@TX@@")
    for extra in ("ts_us", "ts_ns"):
        src.pop(extra, None)
        payload.pop(extra, None)
    parts = _cut(json.dumps(payload, separators=(",", ":"), ensure_ascii=False) + "}")
    return _Shape(key_parts, head, parts, texts)


@cache
def _shapes(templates_file: str) -> dict[str, dict[str, _Shape]]:
    return {
        table: {op: _shape(t) for op, t in by_op.items()}
        for table, by_op in load_templates(Path(templates_file)).items()
    }


@cache
def _pool(length: int, seed: int) -> tuple[str, ...]:
    rng = random.Random(seed * 1_000_003 + length)
    return tuple("".join(rng.choices(_ALPHABET, k=length)) for _ in range(POOL))


def toast_column(workload: Workload, topic: str, templates_file: str | None = None) -> str | None:
    """The column whose updates carry a TOAST placeholder (`toast_share`) in a topic:
    the longest text column of its update template."""
    from cdclake_bench.templates import TEMPLATES_FILE

    shape = _shapes(str(templates_file or TEMPLATES_FILE))[workload.table_of(topic)].get("u")
    if shape is None or not shape.texts:
        return None
    return max(shape.texts, key=shape.texts.get).removeprefix("T_")


def _fill(parts: list[str], values: dict[str, str]) -> str:
    out = list(parts)
    for i in range(1, len(out), 2):
        out[i] = values[out[i]]
    return "".join(out)


def generate_slice(
    workload: Workload,
    topic: str,
    partition: int,
    start: int,
    end: int,
    alive: set[int] | None = None,
    templates_file: str | None = None,
) -> Iterator[dict[str, list]]:
    """Columns (offset, timestamp, key, value) for offsets [start, end) of one
    topic-partition, in chunks. `alive` carries which keys exist between slices."""
    from cdclake_bench.templates import TEMPLATES_FILE

    shapes = _shapes(str(templates_file or TEMPLATES_FILE))[workload.table_of(topic)]
    keys = workload.keys_of(topic, partition)
    rng = random.Random(f"{workload.seed}/{topic}/{partition}/{start}")
    alive = set() if alive is None else alive
    base_ts = 1_760_000_000_000
    cols: dict[str, list] = {"offset": [], "timestamp": [], "key": [], "value": []}
    offset = start
    pending_tombstone: int | None = None
    while offset < end:
        if pending_tombstone is not None:
            key_id, op, pending_tombstone = pending_tombstone, "tombstone", None
        else:
            key_id = keys[rng.randrange(len(keys))]
            if key_id not in alive:
                op = "c"
                alive.add(key_id)
            elif rng.random() < workload.delete_share and offset + 1 < end:
                op = "d"
                alive.discard(key_id)
                pending_tombstone = key_id
            else:
                op = "u"
        shape = shapes[op]
        ts = base_ts + offset
        values = {"ID": str(key_id), "TS": str(ts), "LSN": str(10_000_000 + offset * 64),
                  "TX": str(1000 + offset)}  # fmt: skip
        for hole, length in shape.texts.items():
            values[hole] = (
                '"' + _pool(length, zlib.crc32(hole.encode()) & 0xFF)[rng.randrange(POOL)] + '"'
            )
        if workload.toast_share and op == "u" and shape.texts:
            if rng.random() < workload.toast_share:
                values[max(shape.texts, key=shape.texts.get)] = f'"{TOAST_PLACEHOLDER}"'
        cols["offset"].append(offset)
        cols["timestamp"].append(ts)
        cols["key"].append(_fill(shape.key_parts, values).encode())
        cols["value"].append(
            None
            if op == "tombstone"
            else shape.value_head + _fill(shape.value_parts, values).encode()
        )
        offset += 1
        if len(cols["offset"]) >= 10_000:
            yield cols
            cols = {"offset": [], "timestamp": [], "key": [], "value": []}
    if cols["offset"]:
        yield cols
