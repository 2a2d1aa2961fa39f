"""Iceberg table maintenance: compact data files, compact position deletes, expire
snapshots, remove orphan files; one table at a time, without losing the committed offsets.

The offsets a table has consumed live in the summary of the newest snapshot that carries
`cdclake.offsets`; the planner and the load find it by walking back from the current
snapshot. Maintenance keeps that walk working:

- rewrite commits do not copy the offsets forward. A rewrite reads the table, works for a
  while and commits on top of whatever is current then; if a load committed meanwhile,
  copied offsets would be older than the load's and would roll the table back. Rewrite
  commits carry `cdclake.maintenance` instead, and the walk steps past them to the load.
- expiry keeps the newest snapshot with offsets and every snapshot after it, whatever the
  retention settings say (`expiry_bounds`).
- after every step the offsets are read again the way the planner reads them; if any
  partition went missing or back, the run stops with a MaintenanceError.

What loads killed before their commit leave goes the same way, once it is older than
`orphan_older_than_hours`: their files (of the table and of the tables kept beside it)
through the orphan removal, their `STAGE_PREFIX` branches by `_drop_dead_branches`. No
writer runs that long (every Airflow task that writes has an execution timeout below
`ORPHAN_MIN_HOURS`), so nothing a running writer may still commit is that old.

The Iceberg Spark actions are called through the JVM (`SparkActions`): unlike the SQL
procedures they take snapshot properties, and they have no 24-hour floor for orphan files
(the config enforces one instead, see `ORPHAN_MIN_HOURS`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from cdclake.config import MaintenanceConfig, PipelineConfig, TableConfig
from cdclake.exceptions import MaintenanceError
from cdclake.iceberg.deleted_keys import deleted_keys_table, prune_deleted_keys
from cdclake.iceberg.history import history_table
from cdclake.iceberg.key_changes import key_changes_table
from cdclake.iceberg.tables import (
    DEAD_LETTERS,
    JvmObject,
    committed_offsets,
    conflicts_reported,
    fresh_table,
    jvm_ancestors,
    spark_actions,
    stage_branches,
)
from cdclake.kafka.topics import discover
from cdclake.offsets import SUMMARY_OFFSETS, TopicPartition

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

SUMMARY_MAINTENANCE = "cdclake.maintenance"  # which maintenance step wrote a snapshot
# Table property holding the figures of the last maintenance run (JSON), readable by any
# Iceberg client: how the Airflow report task learns what the spark-submit job did.
PROPERTY_LAST_RUN = "cdclake.maintenance.last-run"
HOUR_MS = 3_600_000

# a rewrite or expiry never creates tables: only commit refusals are conflicts here
_CONFLICTS = ("ValidationException", "CommitFailedException", "Found conflicting files")


class MaintenanceStatus(StrEnum):
    MAINTAINED = "maintained"
    MISSING = "missing"  # the table does not exist yet


@dataclass(frozen=True)
class TableMaintenance:
    """What maintenance did to one table (file counts are of the current snapshot)."""

    table: str
    status: MaintenanceStatus
    run_id: str = ""
    snapshots_before: int = 0
    snapshots_after: int = 0
    snapshots_expired: int = 0
    data_files_before: int = 0
    data_files_after: int = 0
    delete_files_before: int = 0
    delete_files_after: int = 0
    data_files_rewritten: int = 0
    data_files_added: int = 0
    delete_files_removed_by_rewrite: int = 0
    delete_files_rewritten: int = 0
    delete_files_added: int = 0
    files_deleted_by_expiry: int = 0
    # files no snapshot references, older than `orphan_older_than_hours`, removed from the
    # table's location and its side tables' (what killed loads and rewrites left)
    orphan_files_removed: int = 0
    offsets_snapshot_id: int | None = None
    offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    # side tables kept for this table (the deleted-keys ledger, the key-changes ledger):
    # snapshots expired in each
    side_tables: dict[str, int] = field(default_factory=dict)
    # rows of the deleted-keys ledger no load needs any more (`prune_deleted_keys`)
    ledger_rows_pruned: int = 0
    # branches of loads killed before main took them (older than the orphan bound);
    # snapshots on no branch or tag (theirs, or a run's that lost a race), expired at once
    dead_load_branches_removed: int = 0
    off_main_snapshots_expired: int = 0
    seconds: float = 0.0


def expiry_bounds(
    ancestry: Sequence[tuple[int, bool]], cutoff_ms: int, retain_last: int
) -> tuple[int, int]:
    """(expire older than, retain last) that keep the newest snapshot with offsets.

    `ancestry` is (timestamp ms, carries offsets) of the current snapshot and its parents,
    newest first. Both bounds protect it: retain_last reaches down to it, and nothing as
    young as it is older than the cutoff.
    """
    for depth, (timestamp_ms, has_offsets) in enumerate(ancestry):
        if has_offsets:
            return min(cutoff_ms, timestamp_ms), max(retain_last, depth + 1)
    return cutoff_ms, retain_last


def check_offsets_kept(
    table: str,
    step: str,
    before: Mapping[TopicPartition, int],
    after: Mapping[TopicPartition, int],
) -> None:
    """Offsets may only move forward (a load committing meanwhile), never back or away."""
    lost = {tp: o for tp, o in before.items() if after.get(tp, -1) < o}
    if lost:
        now = {tp: after.get(tp) for tp in lost}
        raise MaintenanceError(
            f"{table}: after {step} the committed offsets read {now} instead of {lost}; "
            "maintenance stopped so that no load replays from the wrong offsets. Inspect the "
            f"snapshot summaries ({table}.snapshots) before loading again."
        )


def run_maintenance(
    pipeline: PipelineConfig,
    spark: SparkSession | None = None,
    run_id: str | None = None,
    now_ms: int | None = None,
) -> dict[str, Any]:
    """`cdclake maintain` and jobs/maintain.py: maintain every table of the pipeline and the
    namespace's dead letters, figures as a dict; the retention windows and the orphan
    bound end at `now_ms` (default: now)."""
    import uuid

    if spark is None:
        from cdclake.spark import build_session

        spark = build_session(pipeline, pipeline.spark.master)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    run_id = run_id or uuid.uuid4().hex
    pipeline = discover(pipeline)
    results = [
        maintain_table(spark, pipeline, t, now_ms, run_id, history)
        for t in pipeline.tables
        for history in ((False, True) if t.history else (False,))
    ]
    dead = f"{pipeline.catalog.name}.{pipeline.namespace}.{DEAD_LETTERS}"
    if spark.catalog.tableExists(dead):
        expired, orphans = maintain_side_table(spark, dead, pipeline.maintenance, now_ms)
        log.info("%s: %d snapshot(s) expired, %d orphan file(s) removed", dead, expired, orphans)
    return {"pipeline": pipeline.name, "run_id": run_id, "tables": [asdict(r) for r in results]}


def maintain_side_table(
    spark: SparkSession, name: str, settings: MaintenanceConfig, now_ms: int
) -> tuple[int, int]:
    """Compact and expire a table cdclake keeps beside the loaded ones (no offsets in it):
    dead letters, deleted-keys and key-changes ledgers, and remove its orphan files.
    Returns the snapshots expired and the orphan files removed."""
    actions = spark_actions(spark)
    with _conflicts_reported(name, "rewrite_data_files"):
        actions.rewriteDataFiles(fresh_table(spark, name)).option(
            "target-file-size-bytes", str(settings.target_file_size_bytes)
        ).option("remove-dangling-deletes", "true").execute()
    before = _count_snapshots(spark, name)
    with _conflicts_reported(name, "expire_snapshots"):
        actions.expireSnapshots(fresh_table(spark, name)).expireOlderThan(
            now_ms - settings.expire_older_than_hours * HOUR_MS
        ).retainLast(max(1, settings.retain_last)).execute()
    orphans = remove_orphans(spark, fresh_table(spark, name), orphan_bound(settings, now_ms))
    return max(0, before - _count_snapshots(spark, name)), orphans


def orphan_bound(settings: MaintenanceConfig, now_ms: int) -> int:
    """The time (ms) before which an unreferenced file, or a load's branch, is a dead
    writer's: `orphan_older_than_hours` before `now_ms`."""
    return now_ms - settings.orphan_older_than_hours * HOUR_MS


def maintain_table(
    spark: SparkSession,
    pipeline: PipelineConfig,
    table: TableConfig,
    now_ms: int,
    run_id: str,
    history: bool = False,
) -> TableMaintenance:
    """Maintain the table (with `history`: its history table, which carries offsets too)."""
    qualified = pipeline.qualified_target(table)
    qualified = history_table(qualified) if history else qualified
    if not spark.catalog.tableExists(qualified):
        log.info("%s: does not exist yet; nothing to maintain", qualified)
        return TableMaintenance(table=qualified, status=MaintenanceStatus.MISSING, run_id=run_id)
    settings = pipeline.maintenance
    started = time.monotonic()
    figures: dict[str, Any] = {
        "dead_load_branches_removed": _drop_dead_branches(
            spark, qualified, orphan_bound(settings, now_ms)
        )
    }
    offsets = committed_offsets(spark, qualified)  # first: a cut history stops here
    figures["snapshots_before"] = _count_snapshots(spark, qualified)
    figures["data_files_before"], figures["delete_files_before"] = _count_files(spark, qualified)

    offsets = _rewrite_files(spark, qualified, settings, figures, offsets)
    offsets = _expire(spark, qualified, settings, now_ms, figures, offsets)

    figures["orphan_files_removed"] = remove_orphans(
        spark, fresh_table(spark, qualified), orphan_bound(settings, now_ms)
    )
    offsets = _checked(spark, qualified, "remove_orphan_files", offsets)

    figures["snapshots_after"] = _count_snapshots(spark, qualified)
    figures["data_files_after"], figures["delete_files_after"] = _count_files(spark, qualified)
    ancestors = jvm_ancestors(fresh_table(spark, qualified), qualified)
    figures["offsets_snapshot_id"] = next(
        (snapshot_id for snapshot_id, _, s in ancestors if SUMMARY_OFFSETS in s), None
    )
    figures["offsets"] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        figures["offsets"].setdefault(topic, {})[str(partition)] = offset
    _maintain_side_tables(spark, qualified, settings, now_ms, figures)
    result = TableMaintenance(
        table=qualified,
        status=MaintenanceStatus.MAINTAINED,
        run_id=run_id,
        seconds=round(time.monotonic() - started, 3),
        **figures,
    )
    # a metadata-only commit: Iceberg re-applies it on top of a concurrent load
    fresh_table(spark, qualified).updateProperties().set(
        PROPERTY_LAST_RUN, json.dumps(asdict(result), sort_keys=True)
    ).commit()
    log.info(
        "%s: data files %d -> %d, delete files %d -> %d, snapshots %d -> %d, "
        "%d orphan file(s) removed, %d deleted-keys ledger row(s) pruned",
        qualified,
        result.data_files_before,
        result.data_files_after,
        result.delete_files_before,
        result.delete_files_after,
        result.snapshots_before,
        result.snapshots_after,
        result.orphan_files_removed,
        result.ledger_rows_pruned,
    )
    return result


def _maintain_side_tables(
    spark: SparkSession,
    qualified: str,
    settings: MaintenanceConfig,
    now_ms: int,
    figures: dict[str, Any],
) -> None:
    """Prune the table's deleted-keys ledger, then maintain it and the key-changes ledger
    (those that exist), their figures into `figures`."""
    ledger = deleted_keys_table(qualified)
    if spark.catalog.tableExists(ledger):
        with _conflicts_reported(ledger, "prune_deleted_keys"):
            figures["ledger_rows_pruned"] = prune_deleted_keys(spark, qualified)
    figures["side_tables"] = {}
    for side in (ledger, key_changes_table(qualified)):
        if spark.catalog.tableExists(side):
            expired, orphans = maintain_side_table(spark, side, settings, now_ms)
            figures["side_tables"][side] = expired
            figures["orphan_files_removed"] += orphans


def _rewrite_files(
    spark: SparkSession,
    qualified: str,
    settings: MaintenanceConfig,
    figures: dict[str, Any],
    offsets: dict[TopicPartition, int],
) -> dict[TopicPartition, int]:
    """Compact data files, then rewrite position deletes, their counts into `figures`;
    the offsets, checked after each."""
    actions = spark_actions(spark)
    with _conflicts_reported(qualified, "rewrite_data_files"):
        rewrite = (
            actions.rewriteDataFiles(fresh_table(spark, qualified))
            .option("target-file-size-bytes", str(settings.target_file_size_bytes))
            .option("min-input-files", str(settings.min_input_files))
            .option("delete-file-threshold", str(settings.delete_file_threshold))
            .option("remove-dangling-deletes", "true")
            .snapshotProperty(SUMMARY_MAINTENANCE, "rewrite_data_files")
            .execute()
        )
    figures["data_files_rewritten"] = rewrite.rewrittenDataFilesCount()
    figures["data_files_added"] = rewrite.addedDataFilesCount()
    figures["delete_files_removed_by_rewrite"] = rewrite.removedDeleteFilesCount()
    offsets = _checked(spark, qualified, "rewrite_data_files", offsets)

    with _conflicts_reported(qualified, "rewrite_position_delete_files"):
        deletes = (
            actions.rewritePositionDeletes(fresh_table(spark, qualified))
            # all of them: rewriting drops the deletes of data files step 1 replaced, which
            # Iceberg's dangling-delete check (and min-input-files grouping) leave behind;
            # loads keep at most one delete file per data file, so this stays small
            .option("rewrite-all", "true")
            .snapshotProperty(SUMMARY_MAINTENANCE, "rewrite_position_delete_files")
            .execute()
        )
    figures["delete_files_rewritten"] = deletes.rewrittenDeleteFilesCount()
    figures["delete_files_added"] = deletes.addedDeleteFilesCount()
    offsets = _checked(spark, qualified, "rewrite_position_delete_files", offsets)
    return offsets


def _expire(
    spark: SparkSession,
    qualified: str,
    settings: MaintenanceConfig,
    now_ms: int,
    figures: dict[str, Any],
    offsets: dict[TopicPartition, int],
) -> dict[TopicPartition, int]:
    """Expire old snapshots, keeping the newest with offsets, the counts into `figures`;
    the offsets, checked."""
    ice = fresh_table(spark, qualified)
    before_expiry = _count_snapshots(spark, qualified)
    ancestry = []  # down to the newest snapshot with offsets: older ones may be expired
    for _, timestamp_ms, summary in jvm_ancestors(ice, qualified):
        ancestry.append((timestamp_ms, SUMMARY_OFFSETS in summary))
        if ancestry[-1][1]:
            break
    older_than, retain = expiry_bounds(
        ancestry, now_ms - settings.expire_older_than_hours * HOUR_MS, settings.retain_last
    )
    off_main = _off_main(ice)
    with _conflicts_reported(qualified, "expire_snapshots"):
        expire = spark_actions(spark).expireSnapshots(ice).expireOlderThan(older_than)
        for snapshot_id in off_main:
            expire = expire.expireSnapshotId(snapshot_id)
        expired = expire.retainLast(retain).execute()
    figures["off_main_snapshots_expired"] = len(off_main)
    figures["files_deleted_by_expiry"] = int(
        expired.deletedDataFilesCount()
        + expired.deletedPositionDeleteFilesCount()
        + expired.deletedEqualityDeleteFilesCount()
    )
    offsets = _checked(spark, qualified, "expire_snapshots", offsets)
    figures["snapshots_expired"] = max(0, before_expiry - _count_snapshots(spark, qualified))
    return offsets


def _drop_dead_branches(spark: SparkSession, qualified: str, older_than_ms: int) -> int:
    """Remove the branches loads make (`STAGE_PREFIX`) made before `older_than_ms`: a load
    commits to its branch and main takes it within its task, which runs less than a day
    (`spark_submit`), so such a branch is a killed load's."""
    ice = fresh_table(spark, qualified)
    names = [name for name, made in stage_branches(ice).items() if made < older_than_ms]
    if names:
        manage = ice.manageSnapshots()
        for name in names:
            manage = manage.removeBranch(name)
        with _conflicts_reported(qualified, "remove_dead_load_branches"):
            manage.commit()
        log.info("%s: branch(es) of dead loads removed: %s", qualified, ", ".join(names))
    return len(names)


def _off_main(ice: JvmObject) -> list[int]:
    """The snapshots no branch or tag reaches: no reader or writer can need them."""
    parents = {int(s.snapshotId()): s.parentId() for s in java_items(ice.snapshots())}
    reached: set[int] = set()
    for ref in list(ice.refs().values()):  # a py4j map
        snapshot_id = int(ref.snapshotId())
        while snapshot_id in parents and snapshot_id not in reached:
            reached.add(snapshot_id)
            parent = parents[snapshot_id]
            snapshot_id = int(parent) if parent is not None else -1
    return sorted(set(parents) - reached)


def _checked(
    spark: SparkSession, qualified: str, step: str, before: dict[TopicPartition, int]
) -> dict[TopicPartition, int]:
    after = committed_offsets(spark, qualified)
    check_offsets_kept(qualified, step, before, after)
    return after


def _count_snapshots(spark: SparkSession, qualified: str) -> int:
    return int(spark.sql(f"SELECT count(*) FROM {qualified}.snapshots").collect()[0][0])


def _count_files(spark: SparkSession, qualified: str) -> tuple[int, int]:
    """(data files, delete files) of the current snapshot."""
    rows = spark.sql(f"SELECT content, count(*) AS n FROM {qualified}.files GROUP BY content")
    counts = {r["content"]: r["n"] for r in rows.collect()}
    return int(counts.get(0, 0)), int(counts.get(1, 0) + counts.get(2, 0))


def _conflicts_reported(qualified: str, step: str) -> AbstractContextManager[None]:
    """A load committing while a rewrite runs makes Iceberg refuse one of the two commits;
    for maintenance that is a retry later, never damage."""
    return conflicts_reported(
        f"{qualified}: {step} conflicted with a load that committed to this table at "
        "the same time; nothing of this step was committed. Run maintenance again.",
        _CONFLICTS,
    )


def remove_orphans(spark: SparkSession, ice: JvmObject, older_than_ms: int) -> int:
    """Iceberg's DeleteOrphanFiles on all of `ice`'s location (data and metadata), for files
    older than `older_than_ms`; listed through the table's own FileIO when it is an object
    store's (Spark's Hadoop has no FileSystem for s3://). How many files it deleted."""
    action = spark_actions(spark).deleteOrphanFiles(ice).olderThan(older_than_ms)
    if not str(ice.io().getClass().getName()).endswith(".HadoopFileIO"):
        action = action.usePrefixListing(True)
    count = 0
    for path in java_items(action.execute().orphanFileLocations()):
        log.debug("%s: removed %s", ice.name(), path)
        count += 1
    return count


def java_items(iterable: JvmObject) -> Iterator[Any]:
    """The items of a Java Iterable, by hasNext/next (py4j's own iteration takes any
    error for the end)."""
    it = iterable.iterator()
    while it.hasNext():
        yield it.next()
