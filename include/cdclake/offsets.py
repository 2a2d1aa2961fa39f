"""Offset ranges and the arithmetic of a batch plan. Pure functions, no I/O."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from cdclake.exceptions import ConfigError

# Keys cdclake writes into each Iceberg snapshot summary it commits.
SUMMARY_OFFSETS = "cdclake.offsets"  # the consumed offsets: the exactly-once state
SUMMARY_BATCH = "cdclake.batch-id"
SUMMARY_RECORDS = "cdclake.records"
SUMMARY_UPSERTS = "cdclake.upserts"
SUMMARY_DELETES = "cdclake.deletes"
SUMMARY_SOURCE_TS = "cdclake.max-source-ts-ms"
# the LSN of the last truncate a load applied, carried by every load's commit
SUMMARY_TRUNCATE = "cdclake.truncate-lsn"

# a table healing a retention gap (`Heal`), carried by its commits until healed; then
# what the heal did
SUMMARY_HEAL = "cdclake.heal"
SUMMARY_HEALED = "cdclake.healed"
# the source transaction a batch cut every table at (`consistency: transaction`, `Cut`)
SUMMARY_CUT = "cdclake.consistent-cut"

TopicPartition = tuple[str, int]


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Records [start, end) of one topic-partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Watermarks:
    low: int  # earliest offset still in Kafka
    high: int  # next offset Kafka will assign


def utc_text(ms: int) -> str:
    """A time (epoch ms) as reports, logs and status say it: `2026-11-30 03:06:18 UTC`."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


@dataclass(frozen=True)
class Heal:
    """A table healing a retention gap (`on_gap: resnapshot`, `cdclake_control.gaps`): the
    incremental snapshot `signal_id` was sent at `since_ms`, its notifications follow
    `notes_from`; `marks` were its topic's end offsets then. Once the snapshot completed
    and a batch read past its records, the rows last written by a record below `marks`
    are rows the source no longer holds: that batch removes them (`sweep`)."""

    signal_id: str
    since_ms: int
    lost: tuple[tuple[int, int, int], ...]  # (partition, first lost offset, log start)
    marks: Mapping[int, int]  # partition -> end offset when the snapshot was sent
    notes_from: Mapping[int, int]  # partition of the notification topic -> offset
    sweep: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "lost": [list(x) for x in self.lost]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Heal:
        return cls(
            signal_id=str(data["signal_id"]),
            since_ms=int(data["since_ms"]),
            lost=tuple((int(p), int(a), int(b)) for p, a, b in data["lost"]),
            marks={int(p): int(o) for p, o in data["marks"].items()},
            notes_from={int(p): int(o) for p, o in data["notes_from"].items()},
            sweep=bool(data.get("sweep", False)),
        )


@dataclass(frozen=True)
class Cut:
    """The source transaction every table of a batch ends at (`consistency: transaction`,
    `cdclake_control.consistency`): its id, commit LSN and commit time, and the offset of
    the transaction topic after its END record (where the next plan reads on)."""

    txid: int
    lsn: int | None
    ts_ms: int
    after: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Cut:
        data = json.loads(text)
        lsn = data.get("lsn")
        txid, ts_ms, after = int(data["txid"]), int(data["ts_ms"]), int(data["after"])
        return cls(txid, None if lsn is None else int(lsn), ts_ms, after)

    def describe(self) -> str:
        """ "consistent as of <commit time>, LSN <lsn>", as status and reports say it."""
        lsn = self.lsn if self.lsn is not None else "?"
        return f"consistent as of {utc_text(self.ts_ms)}, LSN {lsn}"


class PlanMode(StrEnum):
    """How the load job treats a plan's ranges."""

    LOAD = "load"  # the next batch: starts exactly at the committed offsets
    REPLAY = "replay"  # re-apply a range at or before the committed offsets (backfill)
    REBUILD = "rebuild"  # drop the tables first, then load from the earliest offset (backfill)


@dataclass(frozen=True)
class BatchPlan:
    pipeline: str
    batch_id: str
    ranges: tuple[OffsetRange, ...]
    mode: PlanMode = PlanMode.LOAD
    heal: Mapping[str, Heal] = field(default_factory=dict)  # per table's source name
    cut: Cut | None = None  # with `consistency: transaction`

    @property
    def run_prefix(self) -> str:
        """The id shared by every batch of one backfill: the batch id up to its last '/'."""
        return self.batch_id.rsplit("/", 1)[0]

    @property
    def total(self) -> int:
        return sum(r.size for r in self.ranges)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "ranges": [asdict(r) for r in self.ranges],
            "heal": {name: h.to_dict() for name, h in self.heal.items()},
            "cut": None if self.cut is None else json.loads(self.cut.to_json()),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchPlan:
        if not isinstance(data, dict):
            raise ConfigError(f"a batch plan is a JSON object, not {type(data).__name__}")
        missing = [k for k in ("pipeline", "batch_id", "ranges") if k not in data]
        if missing:
            raise ConfigError(f"a batch plan needs {missing}; it has {sorted(data)}")
        listed = data["ranges"]
        if not isinstance(listed, list) or not all(map(_is_range, listed)):
            raise ConfigError(
                f"batch plan {data['batch_id']!r}: ranges must be a list of {{topic, "
                f"partition, start, end}} with integer offsets, not {json.dumps(listed)[:300]}"
            )
        mode = data.get("mode", PlanMode.LOAD.value)
        if mode not in PlanMode.__members__.values():
            raise ConfigError(
                f"batch plan {data['batch_id']!r}: unknown mode {mode!r} (one "
                f"of {[m.value for m in PlanMode]})"
            )
        return cls(
            pipeline=data["pipeline"],
            batch_id=data["batch_id"],
            ranges=tuple(OffsetRange(**r) for r in listed),
            mode=PlanMode(mode),
            heal={name: Heal.from_dict(h) for name, h in data.get("heal", {}).items()},
            cut=Cut.from_json(json.dumps(data["cut"])) if data.get("cut") else None,
        )


def _is_range(r: object) -> bool:
    return (
        isinstance(r, dict)
        and sorted(r) == ["end", "partition", "start", "topic"]
        and isinstance(r["topic"], str)
        and all(type(r[k]) is int for k in ("partition", "start", "end"))
    )


def plans_from_json(text: str) -> list[BatchPlan]:
    """A batch plan's JSON, or a JSON list of them run in order (a backfill's), each
    checked by `BatchPlan.from_dict`."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"the batch plan is not JSON: {exc}") from None
    if not isinstance(data, dict | list):
        raise ConfigError(
            "a batch plan is a JSON object (or a list of them), "
            f"not {type(data).__name__}: {json.dumps(data)[:200]}"
        )
    return [BatchPlan.from_dict(p) for p in (data if isinstance(data, list) else [data])]


def encode_offsets(offsets: Mapping[TopicPartition, int]) -> str:
    """The snapshot-summary value: {topic: {partition: next offset to read}}."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


def decode_offsets(text: str) -> dict[TopicPartition, int]:
    data = json.loads(text)
    return {(t, int(p)): int(o) for t, parts in data.items() for p, o in parts.items()}
