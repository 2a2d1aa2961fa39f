"""Manual backfills: re-apply a range of a pipeline's topics, or rebuild tables from Kafka.

- **replay** re-applies records [start, end) of the chosen tables without ever regressing
  newer state. The range read always reaches the table's committed offsets (a later delete,
  update or snapshot read of a key is then part of the same resolution), the MERGE keeps
  the newer row when the table's `_cdc_lsn` is ahead, and the committed offsets never move
  backwards.
- **rebuild** drops the chosen tables and reloads them from the earliest offset still in
  Kafka up to the end. It refuses when retention has deleted records from the start of a
  topic, since the rebuilt table would then miss rows, unless told that a completed
  incremental snapshot makes the remaining records complete.

A backfill is a list of ordinary batch plans (split by `max_records_per_batch`) that the
same load job runs, one Spark application for all of them. `plan_backfill` is pure: it gets
the committed offsets, Kafka's watermarks and a timestamp lookup from its caller.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar, cast

from cdclake.config import PipelineConfig, TableConfig
from cdclake.exceptions import CdclakeError
from cdclake.offsets import BatchPlan, PlanMode, TopicPartition, Watermarks

from cdclake_control.planner import cut_batch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class BackfillError(CdclakeError):
    """A backfill request that cannot be carried out as asked."""


class Mode(StrEnum):
    REPLAY = "replay"
    REBUILD = "rebuild"


class StartAt(StrEnum):
    EARLIEST = "earliest"
    COMMITTED = "committed"
    OFFSETS = "offsets"
    TIMESTAMP = "timestamp"


class EndAt(StrEnum):
    LATEST = "latest"
    OFFSETS = "offsets"
    TIMESTAMP = "timestamp"


@dataclass(frozen=True)
class Position:
    kind: str  # a StartAt or EndAt value
    offsets: Mapping[str, Mapping[int, int]] = field(default_factory=dict)  # table -> p -> o
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class BackfillRequest:
    tables: tuple[str, ...]  # source (`schema.table`) or target names of the pipeline
    mode: Mode = Mode.REPLAY
    start: Position = Position(StartAt.COMMITTED)
    end: Position = Position(EndAt.LATEST)
    accept_retention_gap: bool = False  # rebuild although Kafka's earliest offset is > 0


_Choice = TypeVar("_Choice", bound=StrEnum)


def _choice(enum: type[_Choice], value: Any, what: str) -> _Choice:
    try:
        return enum(str(value).strip().lower())
    except ValueError:
        raise BackfillError(f"{what}: {value!r} is not one of {[e.value for e in enum]}") from None


def parse_timestamp(value: Any, what: str) -> int:
    """Epoch milliseconds from an integer or an ISO 8601 time (UTC when no offset given)."""
    if isinstance(value, bool):
        raise BackfillError(f"{what}: {value!r} is not a timestamp")
    if isinstance(value, int):
        return value
    text = str(value or "").strip()
    if not text:
        raise BackfillError(f"{what}: a timestamp is required (ISO 8601 or epoch milliseconds)")
    if text.isdigit():
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise BackfillError(
            f"{what}: {text!r} is not an ISO 8601 time (e.g. 2026-11-22T10:00:00+00:00) "
            "or epoch milliseconds"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


def parse_offsets(value: Any, what: str, tables: tuple[str, ...]) -> dict[str, dict[int, int]]:
    """`{"<table>": {"<partition>": offset}}`, or `{"<partition>": offset}` for one table."""
    if isinstance(value, str):
        if not value.strip():
            raise BackfillError(f'{what}: offsets are required, e.g. {{"0": 1200}}')
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise BackfillError(f"{what}: not valid JSON: {exc}") from None
    if not isinstance(value, dict) or not value:
        raise BackfillError(f"{what}: must be a non-empty JSON object of offsets")
    flat = all(not isinstance(v, dict) for v in value.values())
    if flat:
        if len(tables) != 1:
            raise BackfillError(
                f"{what}: with {len(tables)} tables, give offsets per table: "
                '{"<schema.table>": {"<partition>": <offset>}}'
            )
        value = {tables[0]: value}
    out: dict[str, dict[int, int]] = {}
    for table, parts in value.items():
        if not isinstance(parts, dict) or not parts:
            raise BackfillError(f"{what}: offsets of {table!r} must be an object of partitions")
        out[table] = {}
        for p, o in parts.items():
            if not str(p).isdigit():
                raise BackfillError(f"{what}: {table!r}: partition {p!r} is not a number")
            if isinstance(o, bool) or not isinstance(o, int) or o < 0:
                raise BackfillError(
                    f"{what}: {table!r} partition {p}: offset {o!r} is not a whole number >= 0"
                )
            out[table][int(p)] = o
    return out


def parse_request(
    pipeline: PipelineConfig,
    *,
    tables: list[str] | tuple[str, ...] | None,
    mode: str,
    start: str,
    end: str,
    start_offsets: Any = None,
    end_offsets: Any = None,
    start_timestamp: Any = None,
    end_timestamp: Any = None,
    accept_retention_gap: bool = False,
) -> BackfillRequest:
    """Validate a request as given in the Params form or on the command line."""
    if not tables and pipeline.patterns:  # every table: the patterns' too
        from cdclake.kafka.topics import discover

        pipeline = discover(pipeline)
    names = tuple(tables or ()) or tuple(t.source for t in pipeline.tables)
    resolved = []
    for name in names:
        table = pipeline.table_named(name)
        if table is None:
            raise BackfillError(
                f"table {name!r} is not in pipeline {pipeline.name!r} "
                f"(tables: {', '.join(t.source for t in pipeline.tables)})"
            )
        if table.source not in resolved:
            resolved.append(table.source)
    names = tuple(resolved)
    mode_v = _choice(Mode, mode, "mode")
    start_v = _choice(StartAt, start, "start")
    end_v = _choice(EndAt, end, "end")
    if mode_v is Mode.REBUILD and start_v is not StartAt.EARLIEST:
        raise BackfillError(
            f"start: a rebuild always starts at the earliest offset in Kafka; got {start_v.value!r}"
        )

    def position(kind: str, offsets: Any, timestamp: Any, what: str) -> Position:
        if kind == "offsets":
            return Position(kind, offsets=_by_source(parse_offsets(offsets, what, names)))
        if kind == "timestamp":
            return Position(kind, timestamp_ms=parse_timestamp(timestamp, what))
        return Position(kind)

    def _by_source(offsets: dict[str, dict[int, int]]) -> dict[str, dict[int, int]]:
        out = {}
        for name, parts in offsets.items():
            table = pipeline.table_named(name)
            if table is None or table.source not in names:
                raise BackfillError(f"offsets given for {name!r}, which is not being backfilled")
            out[table.source] = parts
        missing = [n for n in names if n not in out]
        if missing:
            raise BackfillError(f"offsets are missing for {', '.join(missing)}")
        return out

    request = BackfillRequest(
        tables=names,
        mode=mode_v,
        start=position(
            start_v.value,
            start_offsets,
            start_timestamp,
            "start_offsets" if start_v is StartAt.OFFSETS else "start_timestamp",
        ),
        end=position(
            end_v.value,
            end_offsets,
            end_timestamp,
            "end_offsets" if end_v is EndAt.OFFSETS else "end_timestamp",
        ),
        accept_retention_gap=bool(accept_retention_gap),
    )
    if (
        request.start.timestamp_ms is not None
        and request.end.timestamp_ms is not None
        and request.start.timestamp_ms > request.end.timestamp_ms
    ):
        raise BackfillError("start_timestamp is after end_timestamp")
    return request


TimeLookup = Callable[[dict[TopicPartition, Watermarks], int], dict[TopicPartition, int]]


def plan_backfill(
    pipeline: PipelineConfig,
    request: BackfillRequest,
    backfill_id: str,
    committed: Mapping[TopicPartition, int | None],
    marks: Mapping[TopicPartition, Watermarks],
    offsets_for_time: TimeLookup,
) -> list[BatchPlan]:
    """The batch plans of a backfill, in order; raises BackfillError naming what is wrong."""
    tables = [pipeline.table_named(name) for name in request.tables]
    bounds: dict[TopicPartition, tuple[int, int]] = {}
    for table in tables:
        assert table is not None
        bounds.update(_table_bounds(pipeline, request, table, committed, marks, offsets_for_time))
    mode = PlanMode.REPLAY if request.mode is Mode.REPLAY else PlanMode.REBUILD
    plans: list[BatchPlan] = []
    cursor = {tp: start for tp, (start, _) in bounds.items()}
    ends = {tp: end for tp, (_, end) in bounds.items()}
    while ranges := cut_batch(cursor, ends, pipeline.max_records_per_batch):
        for r in ranges:
            cursor[(r.topic, r.partition)] = r.end
        plans.append(BatchPlan(pipeline.name, f"{backfill_id}/{len(plans):04d}", ranges, mode))
    return plans


def _table_bounds(
    pipeline: PipelineConfig,
    request: BackfillRequest,
    table: TableConfig,
    committed: Mapping[TopicPartition, int | None],
    marks: Mapping[TopicPartition, Watermarks],
    offsets_for_time: TimeLookup,
) -> dict[TopicPartition, tuple[int, int]]:
    topic = pipeline.topic_for(table)
    parts = {tp: m for tp, m in marks.items() if tp[0] == topic}
    if not parts:
        log.info("%s: topic %s has no records in Kafka; nothing to backfill", table.source, topic)
        return {}

    def resolve(
        pos: Position, default: Callable[[TopicPartition, Watermarks], int], what: str
    ) -> dict[TopicPartition, int]:
        if pos.kind == "offsets":
            given = pos.offsets[table.source]
            unknown = sorted(set(given) - {p for _, p in parts})
            if unknown:
                raise BackfillError(
                    f"{what} of {table.source}: topic {topic} has no partition {unknown[0]} "
                    f"(partitions: {', '.join(str(p) for _, p in sorted(parts))})"
                )
            missing = sorted({p for _, p in parts} - set(given))
            if missing:
                raise BackfillError(
                    f"{what} of {table.source}: partition {missing[0]} of {topic} has no offset"
                )
            return {tp: given[tp[1]] for tp in parts}
        if pos.kind == "timestamp":
            assert pos.timestamp_ms is not None
            return offsets_for_time(dict(parts), pos.timestamp_ms)
        return {tp: default(tp, m) for tp, m in parts.items()}

    def committed_or_low(tp: TopicPartition, m: Watermarks) -> int:
        c = committed.get(tp)
        return m.low if c is None else c

    starts = resolve(
        request.start,
        committed_or_low if request.start.kind == "committed" else (lambda tp, m: m.low),
        "start_offsets",
    )
    ends = resolve(request.end, lambda tp, m: m.high, "end_offsets")
    out = {}
    for tp, m in sorted(parts.items()):
        start, end, done = starts[tp], ends[tp], committed.get(tp)
        where = f"{table.source} ({topic} partition {tp[1]})"
        if request.mode is Mode.REBUILD and m.low > 0 and not request.accept_retention_gap:
            raise BackfillError(
                f"{where}: offsets 0..{m.low - 1} were deleted by retention, so a rebuild from "
                "Kafka would miss rows. Run an incremental snapshot of the table first "
                "(cdclake_snapshot), then rebuild with accept_retention_gap."
            )
        if start < m.low:
            raise BackfillError(
                f"{where}: start offset {start} is before the earliest offset still in Kafka "
                f"({m.low}); records {start}..{m.low - 1} were deleted by retention"
            )
        if end > m.high:
            raise BackfillError(
                f"{where}: end offset {end} is beyond the end of the partition ({m.high})"
            )
        if start > end:
            raise BackfillError(f"{where}: start offset {start} is after end offset {end}")
        if request.mode is Mode.REPLAY:
            position = m.low if done is None else done
            if start > position:
                raise BackfillError(
                    f"{where}: start offset {start} is after the table's committed offset "
                    f"{position}; records {position}..{start - 1} would be skipped. A replay "
                    "starts at or before the committed offset."
                )
            # reach the committed offset, so later changes of a key decide (see module doc)
            end = max(end, position)
        out[tp] = (start, end)
    return out


def describe(plans: list[BatchPlan]) -> str:
    if not plans:
        return "nothing to backfill"
    total = sum(p.total for p in plans)
    spans: dict[TopicPartition, tuple[int, int]] = {}
    for plan in plans:
        for r in plan.ranges:
            lo, hi = spans.get((r.topic, r.partition), (r.start, r.end))
            spans[(r.topic, r.partition)] = (min(lo, r.start), max(hi, r.end))
    lines = [f"{plans[0].mode}: {total} records in {len(plans)} batch(es)"]
    lines += [f"  {t}[{p}] offsets {lo}..{hi - 1}" for (t, p), (lo, hi) in sorted(spans.items())]
    return "\n".join(lines)


def plan_pipeline_backfill(
    pipeline: PipelineConfig, request: BackfillRequest, backfill_id: str
) -> list[BatchPlan]:
    """`plan_backfill` with the committed offsets from the catalog and Kafka's watermarks."""
    from cdclake.iceberg.catalog import load_catalog

    from cdclake_control.catalog import table_state
    from cdclake_control.watermarks import fetch_watermarks, offsets_for_time

    cat = load_catalog(pipeline.catalog)
    # the request's tables were found in the pipeline when it was made (`backfill_request`)
    tables = [cast(TableConfig, pipeline.table_named(n)) for n in request.tables]
    committed: dict[TopicPartition, int | None] = {}
    for table in tables:
        committed.update(table_state(cat, pipeline, table).offsets)
    marks = fetch_watermarks(pipeline.kafka, [pipeline.topic_for(t) for t in tables])
    plans = plan_backfill(
        pipeline,
        request,
        backfill_id,
        committed,
        marks,
        lambda parts, ts: offsets_for_time(pipeline.kafka, parts, ts),
    )
    log.info("backfill %s: %s", backfill_id, describe(plans))
    return plans


def run_backfill(
    spark: SparkSession, pipeline: PipelineConfig, plans: list[BatchPlan]
) -> list[dict[str, Any]]:
    """Run the plans in order with the load job; a retried backfill skips what committed."""
    from cdclake.job import run_batch

    out = []
    for plan in plans:
        results = run_batch(spark, pipeline, plan)
        out.append({"batch_id": plan.batch_id, "tables": [r.to_dict() for r in results]})
    return out
