"""Tags of consistent batches (`consistency: transaction`): after a batch that cut every
table at one source transaction, each table of the pipeline, changed or not, is tagged at
its snapshot of that cut, so a query of several tables at one tag sees the source as of
that transaction (`cdclake_control.consistency`)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from cdclake.config import PipelineConfig
from cdclake.iceberg.tables import fresh_table
from cdclake.offsets import Cut

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
CONSISTENT_TAG = "cdclake_consistent"  # moves to each consistent batch
# one per consistent batch, kept `consistent_tags_hours`: cdclake_cut_<ms>_<txid>_<lsn>
CUT_TAG = re.compile(r"cdclake_cut_(\d+)_(\d+)_(\d+)$")
HOUR_MS = 3_600_000


def cut_tag(cut: Cut) -> str:
    return f"cdclake_cut_{cut.ts_ms}_{cut.txid}_{cut.lsn or 0}"


def cut_of(tag: str) -> Cut | None:
    """The cut a tag names (None: not a cut's tag)."""
    found = CUT_TAG.match(tag)
    if found is None:
        return None
    ts_ms, txid, lsn = (int(x) for x in found.groups())
    return Cut(txid, lsn or None, ts_ms, 0)


def tag_consistent(
    spark: SparkSession, pipeline: PipelineConfig, cut: Cut, snapshots: Mapping[str, int | None]
) -> None:
    """Tag each table of the pipeline at the snapshot the batch committed (`snapshots`, by
    qualified name), else its current one: first the cut's own tag on every table, then
    `CONSISTENT_TAG` on every table. Iceberg commits table by table, so a load killed
    half-way leaves the moving tag at two cuts until the next batch; a cut's own tag on
    every table is never partial that way (`cdclake_control.catalog` reads the newest)."""
    name = cut_tag(cut)
    tagged = {}
    for table in pipeline.tables:
        qualified = pipeline.qualified_target(table)
        if not spark.catalog.tableExists(qualified):
            continue
        ice = fresh_table(spark, qualified)
        current = ice.currentSnapshot()
        snapshot_id = snapshots.get(qualified) or (current and int(current.snapshotId()))
        if snapshot_id is None:
            continue
        tagged[qualified] = snapshot_id
        if not ice.refs().containsKey(name):
            keep_ms = pipeline.consistent_tags_hours * HOUR_MS
            ice.manageSnapshots().createTag(name, snapshot_id).setMaxRefAgeMs(
                name, keep_ms
            ).commit()
    for qualified, snapshot_id in tagged.items():
        ice = fresh_table(spark, qualified)
        manage = ice.manageSnapshots()
        if ice.refs().containsKey(CONSISTENT_TAG):
            manage.replaceTag(CONSISTENT_TAG, snapshot_id).commit()
        else:
            manage.createTag(CONSISTENT_TAG, snapshot_id).commit()
    log.info("%s: every table tagged %s (%s)", pipeline.name, name, cut.describe())
