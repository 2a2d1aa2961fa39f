"""The raw scan of a batch the driver read: what one pass over its raw records tells
before anything is decoded (the schemas of each topic, the records that are not
envelopes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class RawScan:
    """What one pass over a batch's raw records tells: per topic, the key and value
    schemas (id, text; oldest first by their last offset) of the records that split,
    and the first record that did not (partition, offset, error) with their count."""

    schemas: dict[str, dict[str, list[tuple[int, str]]]]
    broken: dict[str, tuple[int, int, str]]
    broken_counts: dict[str, int]

    @property
    def broken_count(self) -> int:
        return sum(self.broken_counts.values())


def scan_rows(rows: pa.Table | pa.RecordBatch) -> RawScan:
    """What one pass over raw rows (the reader's Arrow rows) tells."""
    tally = _Tally()
    tally.add_rows(rows)
    return tally.scan()


Group = tuple[str, str, int]  # topic, side ("key" or "value"), schema id
# the raw rows' columns a tally reads
SCAN_COLUMNS = [
    "topic",
    "partition",
    "offset",
    "error",
    "key_schema_id",
    "key_schema",
    "value_schema_id",
    "value_schema",
]


@dataclass
class _Tally:
    """What a pass has met so far: each schema's text and where a record that split last
    used it (partition, offset), the first broken record of each topic and their
    count."""

    last: dict[Group, tuple[int, int]] = field(default_factory=dict)
    texts: dict[Group, str | None] = field(default_factory=dict)
    broken: dict[str, tuple[int, int, str]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # broken records per topic

    def add_rows(self, rows: pa.Table) -> None:
        columns = rows.select(SCAN_COLUMNS).to_pydict()
        for i, topic in enumerate(columns["topic"]):
            partition, offset = columns["partition"][i], columns["offset"][i]
            error = columns["error"][i]
            for side in ("key", "value"):
                sid = columns[f"{side}_schema_id"][i]
                if sid is not None:
                    self._use(
                        (topic, side, sid),
                        columns[f"{side}_schema"][i],
                        None if error is not None else (partition, offset),
                    )
            if error is not None:
                self._broke(topic, (partition, offset, error), 1)

    def _use(self, group: Group, text: str | None, at: tuple[int, int] | None) -> None:
        if self.texts.get(group) is None:  # the reader sends a text with a task's first use
            self.texts[group] = text
        if at is not None:
            self.last[group] = max(self.last.get(group, at), at)

    def _broke(self, topic: str, first: tuple[int, int, str], count: int) -> None:
        self.counts[topic] = self.counts.get(topic, 0) + count
        self.broken[topic] = min(self.broken.get(topic, first), first)

    def scan(self) -> RawScan:
        """The schemas of each topic that a record that split used, oldest first by
        where they were last used (offset, then partition)."""
        schemas: dict[str, dict[str, list[tuple[int, str]]]] = {}
        last = self.last
        for topic, side, sid in sorted(last, key=lambda g: (g[0], last[g][1], last[g][0])):
            schemas.setdefault(topic, {}).setdefault(side, []).append(
                # the reader sends each schema's text with its first use in a task
                (sid, cast(str, self.texts[(topic, side, sid)]))
            )
        return RawScan(schemas, self.broken, self.counts)
