"""The Iceberg catalog from outside Spark (pyiceberg): committed offsets, table state."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdclake.config import PipelineConfig, TableConfig
from cdclake.exceptions import EndpointError
from cdclake.iceberg.catalog import ancestry, load_catalog, summaries, summary_of
from cdclake.iceberg.maintenance import PROPERTY_LAST_RUN
from cdclake.iceberg.snapshots import committed_from_snapshots
from cdclake.iceberg.tags import CONSISTENT_TAG, cut_of
from cdclake.kafka.topics import discover
from cdclake.offsets import SUMMARY_OFFSETS, Cut, TopicPartition

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot


def _offsets_snapshot(table: Table, name: str = "") -> Snapshot | None:
    """The newest snapshot (walking back from current) that carries committed offsets."""
    ancestors = ancestry(table, name)
    return next((s for s in ancestors if SUMMARY_OFFSETS in summary_of(s)), None)


@dataclass(frozen=True)
class TableState:
    exists: bool
    offsets: dict[TopicPartition, int]
    summary: dict[str, str]
    committed_at_ms: int | None
    # The snapshot that committed `offsets` (the current one unless maintenance came after)
    offsets_summary: dict[str, str] = field(default_factory=dict)
    offsets_committed_at_ms: int | None = None
    # the source transaction its `CONSISTENT_TAG` stands at (`consistency: transaction`)
    consistent: Cut | None = None


def table_state(cat: Catalog, pipeline: PipelineConfig, table: TableConfig) -> TableState:
    from pyiceberg.exceptions import NoSuchTableError

    try:
        ice = cat.load_table((pipeline.namespace, table.target))
    except NoSuchTableError:
        return TableState(False, {}, {}, None)
    except Exception as exc:
        raise EndpointError(
            f"Iceberg catalog {pipeline.catalog.uri}: cannot load "
            f"{pipeline.namespace}.{table.target}: {exc}"
        ) from exc
    snap = ice.current_snapshot()
    name = f"{pipeline.namespace}.{table.target}"
    committed = _offsets_snapshot(ice, name)
    return TableState(
        True,
        committed_from_snapshots(summaries(ice, name)),
        summary_of(snap),
        snap.timestamp_ms if snap else None,
        summary_of(committed),
        committed.timestamp_ms if committed else None,
        _consistent_cut(ice),
    )


def _consistent_cut(table: Table) -> Cut | None:
    """The cut whose tag stands where the table's `CONSISTENT_TAG` does."""
    refs = table.metadata.refs
    moving = refs.get(CONSISTENT_TAG)
    if moving is None:
        return None
    cuts = [cut_of(name) for name, ref in refs.items() if ref.snapshot_id == moving.snapshot_id]
    found = [c for c in cuts if c is not None]
    return max(found, key=lambda c: (c.ts_ms, c.lsn or 0)) if found else None


def last_runs(pipeline: PipelineConfig) -> list[dict[str, Any] | None]:
    """Per table, the figures its last maintenance run stored (None: never maintained)."""
    from pyiceberg.exceptions import NoSuchTableError

    cat = load_catalog(pipeline.catalog)
    pipeline = discover(pipeline)
    out: list[dict[str, Any] | None] = []
    for table in pipeline.tables:
        try:
            ice = cat.load_table((pipeline.namespace, table.target))
        except NoSuchTableError:
            out.append(None)
            continue
        text = ice.properties.get(PROPERTY_LAST_RUN)
        out.append(json.loads(text) if text else None)
    return out
