"""A topic's ranges planned and checked in the driver: the schemas read at the head of its
ranges (`head_schemas`) give the lake columns the range tasks return (`TopicPlan`); each
range's summary (`RangeSummary`) says what its task met, and `accept` keeps a topic's
rows only when its ranges add up."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, cast

from cdclake.debezium.formats import WireFormat
from cdclake.debezium.schema import TopicSchema, topic_schema
from cdclake.kafka.reader import RangeReader
from cdclake.placement import MEASURED, Tuning
from cdclake.resolve.fold import check_key_types
from cdclake.resolve.rows import columns_ddl, result_columns
from cdclake.resolve.rules import Truncate

# the columns a range task returns after the resolved rows' (`TopicPlan.ddl`): on the
# summary row of each range, its summary (JSON) and its keys' hashes (`key_hashes`)
META_COLUMN = "_cdclake_range_meta"
KEYS_COLUMN = "_cdclake_range_keys"
# and on a row of a record that cannot be applied, where it was read, why, and its key
# and value payload texts when it was set aside before it was decoded (for the dead
# letters)
BAD_COLUMN = "_cdclake_range_bad"
BAD_TYPE = "struct<partition:int,offset:bigint,reason:string,key:string,value:string>"
HEAD_RECORDS = 100  # records of a range's head read for the topic's schemas
Schema = tuple[int, str]  # a Connect schema's id and text


@dataclass(frozen=True)
class TopicPlan:
    """What a range task needs to know of its topic and its table: the key and value
    schemas (id, text) its records carry, oldest first, from the head of the topic's
    ranges (`head_schemas`) and from ranges that met others (`RangeSummary.unplanned`;
    no value schema: tombstones only, of the lake table's columns), the schema versions
    whose records cannot be applied (`set_aside`: side, id, why), and the lake table's
    columns. A plan without any schema reads its ranges for their schemas only."""

    topic: str
    key_schemas: tuple[Schema, ...] = ()  # none: no Kafka key (without `key`, a changelog)
    value_schemas: tuple[Schema, ...] = ()
    exclude: tuple[str, ...] = ()
    known: Mapping[str, str] = field(default_factory=dict)  # the lake table's columns
    key: tuple[str, ...] = ()  # the table's configured key columns (else the Kafka key's)
    format: WireFormat = WireFormat.JSON
    tuning: Tuning = MEASURED  # its range_keys and fold_records
    cut: int | None = None  # the LSN of the last truncate the table applied
    set_aside: tuple[tuple[str, int, str], ...] = ()
    # the lake table's key columns: records that carry no Kafka key (a batch of truncates
    # alone) keep them
    lake_key: tuple[str, ...] = ()

    @property
    def planned(self) -> bool:
        """Whether the plan knows a schema (else its ranges are read for theirs)."""
        return bool(self.key_schemas or self.value_schemas)

    @cached_property
    def schema(self) -> TopicSchema:
        """The topic's schema (`DecodeError` for one the lake cannot take)."""
        key = self.key or (() if self.key_schemas else self.lake_key)
        schema = topic_schema(
            [t for _, t in self.key_schemas],
            [t for _, t in self.value_schemas],
            key,
            self.topic,
            self.exclude,
            self.known,
            self.format,
        )
        check_key_types(schema)
        return schema

    def columns(self, toast: bool = True) -> list[tuple[str, str]]:
        """(name, Spark type) of the resolved rows; `toast`: with the TOAST flags (a
        keyed table's)."""
        if not self.planned:
            return []
        return result_columns(self.schema, bool(self.schema.key_names), toast)

    @property
    def ddl(self) -> str:
        """The schema of what a range task returns."""
        meta = f"`{META_COLUMN}` string, `{KEYS_COLUMN}` binary, `{BAD_COLUMN}` {BAD_TYPE}"
        columns = self.columns()
        return f"{columns_ddl(columns)}, {meta}" if columns else meta

    def with_met(
        self,
        summaries: Sequence[RangeSummary],
        misfits: Callable[[dict[str, list[tuple[int, str]]]], Mapping[tuple[str, int], str]],
    ) -> TopicPlan:
        """The plan with the schemas the ranges met beyond it (`RangeSummary.unplanned`),
        those that do not fit the table (`misfits`: schemas -> {(side, id): why}) set
        aside."""
        found = {"key": dict(self.key_schemas), "value": dict(self.value_schemas)}
        for s in summaries:
            for side in ("key", "value"):
                for sid, text in s.unplanned.get(side, []):
                    found[side].setdefault(sid, text)
        for side, sid, _ in self.set_aside:
            found[side].pop(sid, None)
        every = {side: list(texts.items()) for side, texts in found.items()}
        rejected = {**{(side, sid): why for side, sid, why in self.set_aside}, **misfits(every)}
        kept = {
            side: tuple((sid, t) for sid, t in every[side] if (side, sid) not in rejected)
            for side in every
        }
        return dataclasses.replace(
            self,
            key_schemas=kept["key"],
            value_schemas=kept["value"],
            set_aside=tuple((side, sid, why) for (side, sid), why in rejected.items()),
        )


def head_schemas(
    reader: RangeReader, ranges: Sequence[dict[str, Any]], records: int = HEAD_RECORDS
) -> tuple[Schema | None, Schema | None] | None:
    """The key and value schemas (id, text) of the first records that carry them, read
    from the head (`records`) of each range in turn: no value schema (None) when the
    heads hold tombstones only; no key schema (None) when their records have no key (a
    table without one); None when they hold no schema at all."""
    import pyarrow.compute as pc

    found: dict[str, Schema] = {}
    for r in ranges:
        head = {**r, "end": min(r["end"], r["start"] + records)}
        batches = reader(head)
        try:
            for raw in batches:
                for side in ("key", "value"):
                    texts = raw.column(raw.schema.get_field_index(f"{side}_schema"))
                    if side in found or texts.null_count == len(texts):
                        continue
                    at = pc.index(pc.is_valid(texts), True).as_py()
                    sid = raw.column(raw.schema.get_field_index(f"{side}_schema_id"))[at]
                    found[side] = (sid.as_py(), texts[at].as_py())
                if len(found) == 2:
                    return found["key"], found["value"]
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
    return (found.get("key"), found.get("value")) if found else None


@dataclass
class RangeSummary:
    """What one range task met (`partition`: its first range's; a task may read several
    of a topic's ranges in turn). `unplanned` holds the schemas (side -> [id, text]) it
    met that its plan did not know: it returned no row then, and read on for the others."""

    topic: str
    partition: int
    records: int = 0
    key_schemas: list[tuple[int, str]] = field(default_factory=list)
    value_schemas: list[tuple[int, str]] = field(default_factory=list)
    unplanned: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    counts: dict[bool, int] = field(default_factory=dict)  # resolved rows per deleted flag
    max_source_ms: int | None = None
    toast: bool = False  # a TOAST placeholder may be among the values (its text was seen)
    truncate: list[Any] | None = None  # the last truncate: [partition, offset, LSN or None]
    first_lsn: int | None = None  # the lowest LSN of the changes folded
    # records that cannot be applied: [partition, offset, reason], in Kafka order
    bad: list[tuple[int, int, str]] = field(default_factory=list)

    def to_json(self) -> str:
        out = self.__dict__ | {"counts": [[k, v] for k, v in self.counts.items()]}
        return json.dumps(out)

    @classmethod
    def from_json(cls, text: str) -> RangeSummary:
        data = json.loads(text)
        data["counts"] = {bool(k): v for k, v in data["counts"]}
        for side in ("key_schemas", "value_schemas", "bad"):
            data[side] = [tuple(x) for x in data[side]]
        data["unplanned"] = {k: [tuple(x) for x in v] for k, v in data["unplanned"].items()}
        return cls(**data)


@dataclass(frozen=True)
class AcceptedTopic:
    """A topic whose ranges all resolved: its schemas (as `RawScan.schemas` gives them),
    the rows' columns, and what the summaries add up to."""

    schemas: dict[str, list[tuple[int, str]]]
    columns: list[tuple[str, str]]  # (name, Spark type) of the resolved rows
    key_names: tuple[str, ...]
    toast: bool
    counts: dict[bool, int]
    max_source_ms: int | None
    ranges: int
    truncate: Truncate | None = None  # the batch's last truncate
    # records that cannot be applied: (partition, offset, reason), in Kafka order
    bad: tuple[tuple[int, int, str], ...] = ()

    @property
    def ddl(self) -> str:
        return columns_ddl(self.columns)


def accept(
    summaries: Sequence[RangeSummary], plan: TopicPlan, hashes: Sequence[Any] | None = None
) -> AcceptedTopic | str:
    """The topic's ranges taken together, or why they must be read again in one task
    (`hashes`: each task's key hashes, `key_hashes`, which must not share a number).
    The ranges met the plan's schemas only (`unplanned` is empty)."""
    import numpy as np

    # the plan's schemas the ranges met (`RangeFold`)
    keys = {sid: text for s in summaries for sid, text in s.key_schemas}
    values = {sid: text for s in summaries for sid, text in s.value_schemas}
    if hashes is not None and len(hashes) > 1:
        every = np.concatenate(hashes)
        if len(np.unique(every)) != len(every):
            return "a key is in more than one partition"
    truncate = _truncate(summaries)
    if isinstance(truncate, str):
        return truncate
    toast = any(s.toast for s in summaries)
    counts: dict[bool, int] = {}
    for s in summaries:
        for deleted, n in s.counts.items():
            counts[deleted] = counts.get(deleted, 0) + n
    stamps = [s.max_source_ms for s in summaries if s.max_source_ms is not None]
    return AcceptedTopic(
        {"key": list(keys.items()), "value": list(values.items())},
        plan.columns(toast),
        plan.schema.key_names if plan.planned else (),
        toast,
        counts,
        max(stamps) if stamps else None,
        len(summaries),
        truncate,
        tuple(sorted(b for s in summaries for b in s.bad)),
    )


def _truncate(summaries: Sequence[RangeSummary]) -> Truncate | str | None:
    """The topic's last truncate, or why its ranges cannot take it apart. Each range
    started its fold again after its own last truncate. The resolve of the whole topic
    drops, in the other partitions, the changes at or below the truncate's LSN: folded
    apart, those ranges can be kept only when they hold no such change. Truncates in two
    tasks each drop their own ranges' changes before them, which the resolve of the
    whole topic does for the last one only."""
    cut = [s for s in summaries if s.truncate is not None]
    if not cut:
        return None
    if len(cut) > 1:
        return "truncates in more than one partition"
    last = Truncate(*cast(list[Any], cut[0].truncate))  # not None: `cut` holds it
    for s in summaries:
        if (
            s is not cut[0]
            and last.lsn is not None
            and s.first_lsn is not None
            and s.first_lsn <= last.lsn
        ):
            return (
                f"a truncate in partition {last.partition} after changes of partition {s.partition}"
            )
    return last
