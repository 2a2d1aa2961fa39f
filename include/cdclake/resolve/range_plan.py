"""A topic's ranges planned and checked in the driver: the schemas read at the head of its
ranges (`head_schemas`) give the lake columns the range tasks return (`TopicPlan`); each
range's summary (`RangeSummary`) says what its task met, and `accept` keeps a topic's
rows only when its ranges add up."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from cdclake.debezium.formats import WireFormat
from cdclake.debezium.schema import TopicSchema, topic_schema
from cdclake.kafka.reader import RangeReader
from cdclake.resolve.placement import MEASURED, Tuning
from cdclake.resolve.rows import columns_ddl, result_columns
from cdclake.resolve.rules import Truncate, last_truncate

# the columns a range task returns after the resolved rows' (`TopicPlan.ddl`): on the
# summary row of each range, its summary (JSON) and its keys' hashes (`key_hashes`)
META_COLUMN = "_cdclake_range_meta"
KEYS_COLUMN = "_cdclake_range_keys"
HEAD_RECORDS = 100  # records of a range's head read for the topic's schemas
Schema = tuple[int, str]  # a Connect schema's id and text


@dataclass(frozen=True)
class TopicPlan:
    """What a range task needs to know of its topic and its table: the key and value
    schemas (id, text) every record must carry, from the head of the topic's ranges
    (`head_schemas`; no value schema: tombstones only, of the lake table's columns), and
    the lake table's columns."""

    topic: str
    key_schema: Schema | None  # None: no Kafka key (without `key`, a changelog)
    value_schema: Schema | None
    exclude: tuple[str, ...] = ()
    known: Mapping[str, str] = field(default_factory=dict)  # the lake table's columns
    key: tuple[str, ...] = ()  # the table's configured key columns (else the Kafka key's)
    format: WireFormat = WireFormat.JSON
    tuning: Tuning = MEASURED  # its range_keys and fold_records
    cut: int | None = None  # the LSN of the last truncate the table applied

    @cached_property
    def schema(self) -> TopicSchema:
        keys = [] if self.key_schema is None else [self.key_schema[1]]
        values = [] if self.value_schema is None else [self.value_schema[1]]
        return topic_schema(keys, values, self.key, self.topic, self.exclude, self.known,
                            self.format)  # fmt: skip

    def columns(self, toast: bool = True) -> list[tuple[str, str]]:
        """(name, Spark type) of the resolved rows; `toast`: with the TOAST flags (a
        keyed table's)."""
        return result_columns(self.schema, bool(self.schema.key_names), toast)

    @property
    def ddl(self) -> str:
        """The schema of what a range task returns."""
        return f"{columns_ddl(self.columns())}, `{META_COLUMN}` string, `{KEYS_COLUMN}` binary"


def head_schemas(reader: RangeReader, ranges: Sequence[dict],
                 records: int = HEAD_RECORDS) -> tuple[Schema, Schema | None] | None:  # fmt: skip
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
    """What one range task met. `reason` says why its topic must take the general path
    (None when the range resolved)."""

    topic: str
    partition: int
    records: int = 0
    reason: str | None = None
    key_schemas: list[tuple[int, str]] = field(default_factory=list)
    value_schemas: list[tuple[int, str]] = field(default_factory=list)
    counts: dict[bool, int] = field(default_factory=dict)  # resolved rows per deleted flag
    max_source_ms: int | None = None
    toast: bool = False  # a TOAST placeholder may be among the values (its text was seen)
    truncate: list | None = None  # the range's last truncate: [offset, LSN or None]
    first_lsn: int | None = None  # the lowest LSN of the changes folded
    # records that cannot be applied: [partition, offset, reason], in Kafka order
    bad: list = field(default_factory=list)

    def to_json(self) -> str:
        out = self.__dict__ | {"counts": [[k, v] for k, v in self.counts.items()]}
        return json.dumps(out)

    @classmethod
    def from_json(cls, text: str) -> RangeSummary:
        data = json.loads(text)
        data["counts"] = {bool(k): v for k, v in data["counts"]}
        for side in ("key_schemas", "value_schemas", "bad"):
            data[side] = [tuple(x) for x in data[side]]
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


def accept(summaries: Sequence[RangeSummary], plan: TopicPlan,
           hashes: Sequence | None = None) -> AcceptedTopic | str:  # fmt: skip
    """The topic's ranges taken together, or why the topic takes the general path.
    `hashes`: each range's key hashes (`key_hashes`), which must not share a number."""
    import numpy as np

    for s in summaries:
        if s.reason is not None:
            return f"partition {s.partition}: {s.reason}"
    # every range met the plan's schemas only (`RangeFold`): these are they, as met
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
        plan.columns(toast), plan.schema.key_names, toast, counts,
        max(stamps) if stamps else None, len(summaries), truncate,
        tuple(sorted(b for s in summaries for b in s.bad)),
    )  # fmt: skip


def _truncate(summaries: Sequence[RangeSummary]) -> Truncate | str | None:
    """The topic's last truncate, or why its ranges cannot take it. Each range started
    its fold again after its own last truncate. The resolve of the whole topic drops, in
    the other partitions, the changes at or below the truncate's LSN: resolved apart,
    those ranges can be kept only when they hold no such change. Truncates in two
    partitions each drop their own partition's changes before them, which the resolve of
    the whole topic does for the last one only."""
    cut = [s for s in summaries if s.truncate is not None]
    if not cut:
        return None
    if len({s.partition for s in cut}) > 1:
        return "truncates in more than one partition"
    last = last_truncate(Truncate(s.partition, *s.truncate) for s in cut)
    for s in summaries:
        if (s.partition != last.partition and last.lsn is not None
                and s.first_lsn is not None and s.first_lsn <= last.lsn):  # fmt: skip
            return (f"a truncate in partition {last.partition} after changes of partition "
                    f"{s.partition}")  # fmt: skip
    return last
