"""A load's commit through a classic session's JVM (`write.committing` on a driver of its
own): the same branch, summary and fast-forward as on Spark Connect, with the summary on
every commit of the load (Iceberg's `CommitMetadata` thread-local, set through py4j) and
the branch taken and removed in one metadata commit. Each table of a batch spares a
summary commit's Spark job, three SQL statements and a metadata read: about a second a
table and batch on the test suite's warm sessions (docs/performance.md)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from cdclake.exceptions import CommitConflictError
from cdclake.iceberg.tables import JvmObject, current_snapshot, load_iceberg_table
from cdclake.offsets import SUMMARY_BATCH, SUMMARY_OFFSETS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@contextmanager
def commit_properties(spark: SparkSession, properties: Mapping[str, str]) -> Iterator[None]:
    """Snapshot-summary properties for every Iceberg commit this thread makes inside.

    Iceberg's Spark writes read them from `CommitMetadata`'s thread-local; PySpark pins
    each Python thread to one JVM thread, and SQL commands commit on the calling thread.
    """
    jvm: Any = spark.sparkContext._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    cls = jvm.java.lang.Class.forName("org.apache.iceberg.spark.CommitMetadata", True, loader)
    field = cls.getDeclaredField("COMMIT_PROPERTIES")
    field.setAccessible(True)
    local = field.get(None)
    local.set(properties)  # py4j passes a Python mapping as a java.util.HashMap
    try:
        yield
    finally:
        local.remove()


def jvm_commit_empty(
    spark: SparkSession, table: str, properties: Mapping[str, str], branch: str = "main"
) -> None:
    """A snapshot with no data change, carrying the summary, by Iceberg's API."""
    append = load_iceberg_table(spark, table).newAppend().toBranch(branch)
    for k, v in properties.items():
        append = append.set(k, v)
    append.commit()


@contextmanager
def jvm_staged(
    spark: SparkSession,
    qualified: str,
    before_id: int | None,
    name: str | None,
    props: Mapping[str, str],
) -> Iterator[None]:
    """The load's commits inside, each carrying `props`, go to the branch `name` made at
    `before_id` (an empty commit carries `props` when nothing else was committed to it),
    which main then takes; without a branch (a table without snapshot) to the table
    directly, checked by `jvm_check_commit`."""
    with commit_properties(spark, props):
        if name is None:
            yield
            return
        ice = load_iceberg_table(spark, qualified)
        ice.manageSnapshots().createBranch(name, before_id).commit()
        try:
            yield
            ice = load_iceberg_table(spark, qualified)
            branch = ice.refs().get(name)  # None: removed meanwhile
            if branch is not None and branch.snapshotId() == before_id:
                jvm_commit_empty(spark, qualified, props, branch=name)
                ice = load_iceberg_table(spark, qualified)
            if not _made_by_batch(ice, name, before_id, props[SUMMARY_BATCH]):
                raise CommitConflictError(
                    f"{qualified}: this batch's branch {name} was removed while it loaded "
                    "(taken for a killed load's); nothing of the batch was committed. "
                    "Plan again."
                )
            # main takes the branch and the branch goes, in one metadata commit; refused
            # when main is no longer at `before_id`'s line (another commit reached it)
            try:
                ice.manageSnapshots().fastForwardBranch("main", name).removeBranch(name).commit()
            except Exception as exc:
                if "Cannot fast-forward" not in str(exc):
                    raise
                raise CommitConflictError(
                    f"{qualified}: another commit reached the table after snapshot "
                    f"{before_id}, which this batch's offsets were read from; nothing of "
                    "the batch was committed. Plan again."
                ) from exc
        except BaseException:
            try:
                load_iceberg_table(spark, qualified).manageSnapshots().removeBranch(name).commit()
            except Exception as exc:  # maintenance removes it
                log.warning("%s: branch %s not removed: %s", qualified, name, exc)
            raise


def _made_by_batch(ice: JvmObject, name: str, before_id: int | None, batch_id: str) -> bool:
    """Whether branch `name` holds, above snapshot `before_id`, only commits of batch
    `batch_id`: a branch removed while its load wrote and made again by the load's next
    commit stands on main's snapshot of then, which may hold another run's commit."""
    ref = ice.refs().get(name)
    snapshot = None if ref is None else ice.snapshot(ref.snapshotId())
    while snapshot is not None and int(snapshot.snapshotId()) != before_id:
        if dict(snapshot.summary()).get(SUMMARY_BATCH) != batch_id:
            return False
        parent = snapshot.parentId()
        snapshot = None if parent is None else ice.snapshot(parent)
    return snapshot is not None


def jvm_check_commit(
    spark: SparkSession, qualified: str, before_id: int | None, props: Mapping[str, str]
) -> int | None:
    """The snapshot that carries the batch's offsets: an empty commit carries them when
    nothing changed; another run's commit in between fails the check."""
    after_id, summary = current_snapshot(spark, qualified)
    if after_id == before_id:
        jvm_commit_empty(spark, qualified, props)  # nothing changed, offsets still move
        after_id, summary = current_snapshot(spark, qualified)
    if summary.get(SUMMARY_OFFSETS) != props[SUMMARY_OFFSETS]:
        raise CommitConflictError(
            f"{qualified}: snapshot {after_id} does not carry this batch's offsets"
        )
    return after_id
