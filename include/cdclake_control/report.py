"""Per-table figures after a run: what its batches did and how far behind the lake is."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from cdclake.config import PipelineConfig, TableConfig
from cdclake.exceptions import EndpointError
from cdclake.iceberg.catalog import load_catalog
from cdclake.kafka.topics import discover
from cdclake.offsets import (
    SUMMARY_BATCH,
    SUMMARY_DELETES,
    SUMMARY_RECORDS,
    SUMMARY_UPSERTS,
    BatchPlan,
)

from cdclake_control.catalog import TableState, table_state
from cdclake_control.lag import offsets_behind, source_lag
from cdclake_control.watermarks import fetch_watermarks

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

_COUNTS = (SUMMARY_RECORDS, SUMMARY_UPSERTS, SUMMARY_DELETES)


@dataclass(frozen=True)
class TableReport:
    table: str
    exists: bool
    batch_id: str | None  # the batch that committed the table's offsets
    loaded_this_batch: bool  # a batch of this run committed to the table
    records: int  # Kafka records this run's batches loaded into the table
    upserts: int
    deletes: int
    offsets_behind: int
    committed_at_ms: int | None
    seconds_behind_source: float | None

    @property
    def changed(self) -> bool:
        """This run loaded records into the table: it gets an asset event."""
        return self.records > 0

    @property
    def committed_at(self) -> str | None:
        """When the table's offsets were committed, ISO 8601 in UTC."""
        if self.committed_at_ms is None:
            return None
        at = dt.datetime.fromtimestamp(self.committed_at_ms / 1000, dt.UTC)
        return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "committed_at": self.committed_at}

    def summary(self) -> str:
        """One line of a task log: what the run did to the table and how far behind it is."""
        if not self.exists:
            return f"{self.table}: not created yet (no change loaded)"
        done = (
            f"{self.records} records loaded ({self.upserts} upserts, {self.deletes} deletes)"
            if self.records
            else "nothing new loaded"
        )
        parts = [done, f"{self.offsets_behind} offsets behind Kafka"]
        if self.committed_at is not None:
            parts.append(f"offsets committed at {self.committed_at}")
        if self.seconds_behind_source is not None:
            parts.append(f"{self.seconds_behind_source:.1f} s behind the source")
        return f"{self.table}: {'; '.join(parts)}"


def batches_by_topic(plans: Iterable[BatchPlan]) -> dict[str, set[str]]:
    """The batch ids of a run that read each topic."""
    out: dict[str, set[str]] = {}
    for plan in plans:
        for r in plan.ranges:
            out.setdefault(r.topic, set()).add(plan.batch_id)
    return out


def sum_counts(summaries: Iterable[Mapping[str, str]]) -> tuple[int, int, int]:
    """Records, upserts and deletes over the snapshot summaries of a run's batches."""
    totals = [0, 0, 0]
    for summary in summaries:
        for i, key in enumerate(_COUNTS):
            totals[i] += int(summary.get(key, 0))
    return totals[0], totals[1], totals[2]


def batch_summaries(
    cat: Catalog,
    pipeline: PipelineConfig,
    table: TableConfig,
    state: TableState,
    batch_ids: set[str],
) -> list[dict[str, str]]:
    """The summaries of the table's snapshots committed by `batch_ids`: the one holding the
    offsets when it is the only batch asked for, else found walking back from the current
    snapshot until each was seen (or the history ends). A batch commits once per table."""
    if not batch_ids or not state.exists:
        return []
    if batch_ids == {state.offsets_summary.get(SUMMARY_BATCH)}:
        return [state.offsets_summary]
    name = f"{pipeline.namespace}.{table.target}"
    try:
        ice = cat.load_table((pipeline.namespace, table.target))
    except Exception as exc:
        raise EndpointError(f"Iceberg catalog {pipeline.catalog.uri}: {name}: {exc}") from exc
    out, left = [], set(batch_ids)
    snap = ice.current_snapshot()
    while snap is not None and left:
        summary = dict(snap.summary.additional_properties) if snap.summary else {}
        if summary.get(SUMMARY_BATCH) in left:
            left.discard(summary[SUMMARY_BATCH])
            out.append(summary)
        parent = snap.parent_snapshot_id
        snap = None if parent is None else ice.snapshot_by_id(parent)
    return out


def report_pipeline(
    pipeline: PipelineConfig, plans: Sequence[BatchPlan], now_ms: int
) -> list[TableReport]:
    """One report per table of the pipeline (patterns resolved), for a run of `plans`."""
    pipeline = discover(pipeline)
    cat = load_catalog(pipeline.catalog)
    topics = [pipeline.topic_for(t) for t in pipeline.tables]
    marks = fetch_watermarks(pipeline.kafka, topics)
    states = [table_state(cat, pipeline, t) for t in pipeline.tables]
    lag = source_lag(
        pipeline.kafka, marks, dict(zip(topics, (s.offsets for s in states), strict=True)), now_ms
    )
    by_topic = batches_by_topic(plans)
    out = []
    for table, topic, state in zip(pipeline.tables, topics, states, strict=True):
        ours = batch_summaries(cat, pipeline, table, state, by_topic.get(topic, set()))
        records, upserts, deletes = sum_counts(ours)
        out.append(
            TableReport(
                table=pipeline.qualified_target(table),
                exists=state.exists,
                batch_id=state.offsets_summary.get(SUMMARY_BATCH),
                loaded_this_batch=bool(ours),
                records=records,
                upserts=upserts,
                deletes=deletes,
                offsets_behind=offsets_behind(marks, topic, state.offsets),
                committed_at_ms=state.offsets_committed_at_ms,
                seconds_behind_source=lag[topic],
            )
        )
    return out
