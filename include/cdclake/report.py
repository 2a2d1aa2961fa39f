"""Per-table figures after a load: what the batch did and how far behind the lake is."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from cdclake.catalog import load_catalog, table_state
from cdclake.config import PipelineConfig
from cdclake.kafka import discover, fetch_watermarks
from cdclake.offsets import (
    SUMMARY_BATCH,
    SUMMARY_DELETES,
    SUMMARY_RECORDS,
    SUMMARY_SOURCE_TS,
    SUMMARY_UPSERTS,
    TopicPartition,
    Watermarks,
)


def offsets_behind(
    marks: Mapping[TopicPartition, Watermarks], topic: str, committed: Mapping[TopicPartition, int]
) -> int:
    """Records Kafka holds for `topic` past the committed offsets (from the low watermark
    for a partition never committed)."""
    return sum(
        max(0, m.high - committed.get(tp, m.low)) for tp, m in marks.items() if tp[0] == topic
    )


def seconds_behind_source(behind: int, source_ts_ms: str | int | None, now_ms: int) -> float | None:
    """0 when caught up; else how old the newest committed change is (None: nothing committed).

    While records wait, the lake shows the source as of the newest change it committed, so
    it is at least that far behind; when nothing waits, it is as fresh as the source.
    """
    if source_ts_ms is None:
        return None
    return 0.0 if behind == 0 else max(0.0, (now_ms - int(source_ts_ms)) / 1000)


@dataclass(frozen=True)
class TableReport:
    table: str
    exists: bool
    batch_id: str | None
    loaded_this_batch: bool
    records: int
    upserts: int
    deletes: int
    offsets_behind: int
    committed_at_ms: int | None
    seconds_behind_source: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def report_pipeline(
    pipeline: PipelineConfig, batch_id: str | None, now_ms: int
) -> list[TableReport]:
    pipeline = discover(pipeline)
    cat = load_catalog(pipeline.catalog)
    topics = [pipeline.topic_for(t) for t in pipeline.tables]
    marks = fetch_watermarks(pipeline.kafka, topics)
    out = []
    for table in pipeline.tables:
        state = table_state(cat, pipeline, table)
        topic = pipeline.topic_for(table)
        behind = offsets_behind(marks, topic, state.offsets)
        summary = state.summary
        this_batch = batch_id is not None and summary.get(SUMMARY_BATCH) == batch_id
        lag = seconds_behind_source(behind, summary.get(SUMMARY_SOURCE_TS), now_ms)
        out.append(
            TableReport(
                table=pipeline.qualified_target(table),
                exists=state.exists,
                batch_id=summary.get(SUMMARY_BATCH),
                loaded_this_batch=this_batch,
                records=int(summary.get(SUMMARY_RECORDS, 0)) if this_batch else 0,
                upserts=int(summary.get(SUMMARY_UPSERTS, 0)) if this_batch else 0,
                deletes=int(summary.get(SUMMARY_DELETES, 0)) if this_batch else 0,
                offsets_behind=behind,
                committed_at_ms=state.committed_at_ms,
                seconds_behind_source=lag,
            )
        )
    return out
