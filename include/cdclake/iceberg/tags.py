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
from cdclake.iceberg.catalog import lake_table
from cdclake.offsets import Cut

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
CONSISTENT_TAG = "cdclake_consistent"  # moves to each consistent batch
# one per consistent batch, kept `consistent_tags_hours`: cdclake_cut_<ms>_<txid>_<lsn>
CUT_TAG = re.compile(r"cdclake_cut_(\d+)_(\d+)_(\d+)$")


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
        ice = lake_table(spark, qualified)
        current = None if ice is None else ice.current_snapshot()
        snapshot_id = snapshots.get(qualified) or (current and current.snapshot_id)
        if ice is None or snapshot_id is None:
            continue
        tagged[qualified] = snapshot_id
        if name not in ice.metadata.refs:
            hours = pipeline.consistent_tags_hours
            spark.sql(
                f"ALTER TABLE {qualified} CREATE TAG IF NOT EXISTS {name} "
                f"AS OF VERSION {snapshot_id} RETAIN {hours} HOURS"
            )
    for qualified, snapshot_id in tagged.items():
        spark.sql(
            f"ALTER TABLE {qualified} CREATE OR REPLACE TAG {CONSISTENT_TAG} "
            f"AS OF VERSION {snapshot_id}"
        )
    log.info("%s: every table tagged %s (%s)", pipeline.name, name, cut.describe())
