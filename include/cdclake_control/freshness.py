"""How fresh the lake is, per table: what was last committed and what still waits in Kafka.

Everything comes from the Iceberg snapshots and Kafka (its watermarks, and the first
record waiting in each partition for "behind source", see `cdclake_control.lag`), so the figures
are the ones the loader itself acts on: the offsets and batch id are the exactly-once
state written with the data, not a separate bookkeeping table that could disagree with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cdclake.config import PipelineConfig, TableConfig
from cdclake.iceberg.catalog import load_catalog
from cdclake.iceberg.snapshots import live_rows
from cdclake.kafka.topics import discover
from cdclake.offsets import SUMMARY_BATCH, utc_text
from cdclake.pipeline_file import load_pipeline

from cdclake_control.catalog import TableState, table_state
from cdclake_control.gaps import heal_status
from cdclake_control.lag import offsets_behind, source_lag
from cdclake_control.pipelines import read_pipelines
from cdclake_control.watermarks import fetch_watermarks


@dataclass(frozen=True)
class TableFreshness:
    pipeline: str
    table: str  # <catalog>.<namespace>.<target>
    source: str  # <schema>.<table> in PostgreSQL
    exists: bool
    last_commit_ms: int | None  # when the snapshot holding the committed offsets was written
    offsets_behind: int  # records in Kafka past the committed offsets
    # 0 when caught up, else the age of the oldest change not loaded yet (cdclake_control.lag);
    # None when that change's time is unknown
    seconds_behind_source: float | None
    rows: int | None  # live rows of the current snapshot; None when it cannot be told exactly
    batch_id: str | None  # the batch (DAG run) that committed the offsets
    gap: str | None = None  # a retention gap being healed, or just healed (`gaps.heal_status`)
    consistent: str | None = None  # the source transaction its consistent tag stands at

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def table_freshness(
    pipeline: PipelineConfig,
    table: TableConfig,
    state: TableState,
    behind: int,
    seconds_behind: float | None,
) -> TableFreshness:
    committed = state.offsets_summary
    return TableFreshness(
        pipeline=pipeline.name,
        table=pipeline.qualified_target(table),
        source=table.source,
        exists=state.exists,
        last_commit_ms=state.offsets_committed_at_ms,
        offsets_behind=behind,
        seconds_behind_source=seconds_behind,
        rows=live_rows(state.summary) if state.exists else None,
        batch_id=committed.get(SUMMARY_BATCH),
        gap=heal_status(committed, state.offsets_committed_at_ms),
        consistent=state.consistent.describe() if state.consistent else None,
    )


def pipeline_freshness(pipeline: PipelineConfig, now_ms: int) -> list[TableFreshness]:
    """One row per table of the pipeline, in config order (then the tables its patterns
    match)."""
    pipeline = discover(pipeline)
    cat = load_catalog(pipeline.catalog)
    topics = [pipeline.topic_for(t) for t in pipeline.tables]
    marks = fetch_watermarks(pipeline.kafka, topics)
    states = [table_state(cat, pipeline, t) for t in pipeline.tables]
    committed = {topic: state.offsets for topic, state in zip(topics, states, strict=True)}
    lag = source_lag(pipeline.kafka, marks, committed, now_ms)
    return [
        table_freshness(
            pipeline, table, state, offsets_behind(marks, topic, state.offsets), lag[topic]
        )
        for table, topic, state in zip(pipeline.tables, topics, states, strict=True)
    ]


def format_time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return utc_text(ms)


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


COLUMNS = (
    "table",
    "last commit",
    "offsets behind",
    "behind source",
    "rows",
    "batch",
    "notes",  # a retention gap healed (`gaps`), the consistent tag (`consistency`)
)
_RIGHT = {"offsets behind", "behind source", "rows"}


def freshness_cells(row: TableFreshness) -> tuple[str, ...]:
    """The display cells of one row, in COLUMNS order (shared by the terminal and the page)."""
    if not row.exists:
        return (
            row.table,
            "not created yet",
            f"{row.offsets_behind:,}",
            format_seconds(row.seconds_behind_source),
            "-",
            "-",
            "-",
        )
    return (
        row.table,
        format_time(row.last_commit_ms),
        f"{row.offsets_behind:,}",
        format_seconds(row.seconds_behind_source),
        "-" if row.rows is None else f"{row.rows:,}",
        row.batch_id or "-",
        "; ".join(x for x in (row.consistent, row.gap) if x) or "-",
    )


def render_freshness(rows: Iterable[TableFreshness]) -> str:
    """An aligned text table; numbers right-aligned."""
    lines = [COLUMNS, *(freshness_cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]

    def fmt(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if name in _RIGHT else c.ljust(w)
            for c, w, name in zip(cells, widths, COLUMNS, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [fmt([c.upper() for c in COLUMNS]), *(fmt(line) for line in lines[1:])]
    return "\n".join(out)


def status_rows(pipeline_path: str | None, now_ms: int) -> list[TableFreshness]:
    """`cdclake status`: one pipeline, or every pipeline of the pipelines directory."""
    if pipeline_path:
        pipelines = [load_pipeline(pipeline_path)]
    else:
        found = read_pipelines()
        found.raise_errors()
        pipelines = list(found.pipelines.values())
    return [r for p in pipelines for r in pipeline_freshness(p, now_ms)]
