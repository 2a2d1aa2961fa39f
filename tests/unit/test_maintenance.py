"""The retention arithmetic that keeps the snapshot holding the committed offsets, and
the figures a table's maintenance reports."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest
from cdclake.config import CatalogConfig, KafkaConfig, PipelineConfig, TableConfig
from cdclake.exceptions import MaintenanceError
from cdclake.iceberg import maintenance
from cdclake.iceberg.maintenance import (
    PROPERTY_LAST_RUN,
    check_offsets_kept,
    expiry_bounds,
    maintain_table,
)
from cdclake.iceberg.tables import deleted_keys_table

HOUR = 3_600_000


@pytest.mark.parametrize(
    "ancestry, cutoff, retain, expected",
    [
        # the current snapshot holds the offsets: settings apply unchanged
        ([(100 * HOUR, True)], 90 * HOUR, 5, (90 * HOUR, 5)),
        # two compactions on top of the last load: retain reaches down to the load
        ([(100 * HOUR, False), (99 * HOUR, False), (98 * HOUR, True)], 99 * HOUR, 1,
         (98 * HOUR, 3)),
        # an idle table: its last load is older than the cutoff, which moves back to it
        ([(500 * HOUR, False), (10 * HOUR, True)], 380 * HOUR, 1, (10 * HOUR, 2)),
        # retain_last larger than needed is kept
        ([(100 * HOUR, False), (99 * HOUR, True)], 50 * HOUR, 10, (50 * HOUR, 10)),
        # no offsets anywhere (a table never loaded): settings apply unchanged
        ([(100 * HOUR, False)], 50 * HOUR, 1, (50 * HOUR, 1)),
        ([], 50 * HOUR, 1, (50 * HOUR, 1)),  # no snapshot at all
    ],
)  # fmt: skip
def test_expiry_bounds_keep_the_offsets_snapshot(ancestry, cutoff, retain, expected):
    assert expiry_bounds(ancestry, cutoff, retain) == expected


@pytest.mark.parametrize(
    "after",
    [
        {("t", 0): 10, ("t", 1): 5},  # unchanged
        {("t", 0): 12, ("t", 1): 5},  # a load committed meanwhile
        {("t", 0): 10, ("t", 1): 5, ("t", 2): 1},  # ... and read a new partition
    ],
)
def test_offsets_may_stay_or_advance(after):
    check_offsets_kept("lake.ns.t", "expire_snapshots", {("t", 0): 10, ("t", 1): 5}, after)


@pytest.mark.parametrize(
    "after",
    [
        {},  # the walk found no offsets: the next load would start at the earliest
        {("t", 0): 10},  # a partition went missing
        {("t", 0): 9, ("t", 1): 5},  # went back
    ],
)
def test_offsets_lost_or_moved_back_stop_maintenance(after):
    with pytest.raises(MaintenanceError, match=r"lake\.ns\.t: after rewrite_data_files"):
        check_offsets_kept("lake.ns.t", "rewrite_data_files", {("t", 0): 10, ("t", 1): 5}, after)


class _Builder:
    """An Iceberg action or table update of the JVM: each call gives it back, `execute`
    gives `result`, `set` records the table property."""

    def __init__(self, result=None, props: dict | None = None) -> None:
        self.result, self.props = result, props

    def __getattr__(self, name):
        return lambda *args: self

    def execute(self):
        return self.result

    def set(self, key, value):
        self.props[key] = value
        return self


def test_a_table_maintenance_reports_each_steps_figures(monkeypatch):
    """Every figure of every step lands in its own field, in what `maintain_table` returns
    and in the table property the Airflow report task reads."""
    pipeline = PipelineConfig(
        name="p", path=Path("p.yaml"), topic_prefix="pg", kafka=KafkaConfig("k:9092"),
        catalog=CatalogConfig("lake", "jdbc", "jdbc:postgresql://h/c", "file:///w"),
        namespace="ns", tables=(TableConfig("public.t", "t"),),
    )  # fmt: skip
    props: dict[str, str] = {}
    counted = {"snapshots": iter([10, 10, 8, 8]), "files": iter([(5, 2), (1, 0)])}
    rewrite = SimpleNamespace(rewrittenDataFilesCount=lambda: 4, addedDataFilesCount=lambda: 1,
                              removedDeleteFilesCount=lambda: 2)  # fmt: skip
    deletes = SimpleNamespace(rewrittenDeleteFilesCount=lambda: 3,
                              addedDeleteFilesCount=lambda: 0)  # fmt: skip
    expired = SimpleNamespace(deletedDataFilesCount=lambda: 6,
                              deletedPositionDeleteFilesCount=lambda: 2,
                              deletedEqualityDeleteFilesCount=lambda: 1)  # fmt: skip
    actions = SimpleNamespace(rewriteDataFiles=lambda t: _Builder(rewrite),
                              rewritePositionDeletes=lambda t: _Builder(deletes),
                              expireSnapshots=lambda t: _Builder(expired))  # fmt: skip
    patches = {
        "committed_offsets": lambda spark, q: {("pg.public.t", 1): 9, ("pg.public.t", 0): 7},
        "_count_snapshots": lambda spark, q: next(counted["snapshots"]),
        "_count_files": lambda spark, q: next(counted["files"]),
        "spark_actions": lambda spark: actions,
        "fresh_table": lambda spark, q: _Builder(props=props),
        "jvm_ancestors": lambda ice, q: [(12, 3000, {}), (11, 2000, {"cdclake.offsets": "{}"})],
        "remove_orphans": lambda spark, ice, older_than: 5,
        "prune_deleted_keys": lambda spark, q: 30,
        "maintain_side_table": lambda spark, name, settings, now_ms: 2,
    }
    for name, fake in patches.items():
        monkeypatch.setattr(maintenance, name, fake)
    spark = SimpleNamespace(catalog=SimpleNamespace(tableExists=lambda name: True))
    leases = SimpleNamespace(take=lambda q: 1, done=lambda q: None)
    result = maintain_table(spark, pipeline, pipeline.tables[0], 10**12, "run-1", leases)
    figures = asdict(result)
    assert figures.pop("seconds") >= 0
    assert figures == {
        "table": "lake.ns.t", "status": "maintained", "run_id": "run-1",
        "snapshots_before": 10, "snapshots_after": 8, "snapshots_expired": 2,
        "data_files_before": 5, "data_files_after": 1, "delete_files_before": 2,
        "delete_files_after": 0, "data_files_rewritten": 4, "data_files_added": 1,
        "delete_files_removed_by_rewrite": 2, "delete_files_rewritten": 3,
        "delete_files_added": 0, "files_deleted_by_expiry": 9, "orphan_files_removed": 5,
        "offsets_snapshot_id": 11, "offsets": {"pg.public.t": {"0": 7, "1": 9}},
        "side_tables": {deleted_keys_table("lake.ns.t"): 2},
        "ledger_rows_pruned": 30, "dead_load_files_removed": 1,
    }  # fmt: skip
    assert props[PROPERTY_LAST_RUN] == json.dumps(asdict(result), sort_keys=True)
