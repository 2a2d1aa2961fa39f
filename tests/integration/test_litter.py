"""What loads killed mid-write leave: the next loads still load exactly once, and the
maintenance run removes the killed loads' files and branches once they are older than
`orphan_older_than_hours`, never sooner."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from cdclake.exceptions import CommitConflictError
from cdclake.iceberg.deleted_keys import deleted_keys_table
from cdclake.iceberg.key_changes import key_changes_table
from cdclake.iceberg.maintenance import HOUR_MS, run_maintenance
from cdclake.iceberg.tables import (
    DEAD_LETTERS,
    STAGE_PREFIX,
    commit_empty,
    current_snapshot,
    load_iceberg_table,
)
from cdclake.iceberg.write import _staged
from cdclake.offsets import SUMMARY_BATCH
from cdclake.placement import MEASURED

from tests.conftest import ROOT
from tests.integration.helpers import (
    assert_lake_equals_source,
    load_all,
    local_path,
    make_pipeline,
)
from tests.integration.test_faults import assert_exactly_once, start_run, workload

pytestmark = pytest.mark.integration


def side_tables(spark, pipeline) -> list[str]:
    """The tables of the pipeline's one table and those cdclake keeps beside it."""
    target = pipeline.qualified_target(pipeline.tables[0])
    dead = f"{pipeline.catalog.name}.{pipeline.namespace}.{DEAD_LETTERS}"
    names = (target, deleted_keys_table(target), key_changes_table(target), dead)
    return [t for t in names if spark.catalog.tableExists(t)]


def unreferenced(spark, table: str) -> set[str]:
    """The files under the table's location that its metadata names nowhere: data and
    delete files of no snapshot, manifests and manifest lists of none, metadata files
    out of its log (what a killed writer leaves)."""
    spark.sql(f"REFRESH TABLE {table}")  # another process may have committed since
    named = {
        r[0]
        for query in (
            f"SELECT file_path FROM {table}.all_files",
            f"SELECT path FROM {table}.all_manifests",
            f"SELECT manifest_list FROM {table}.snapshots",
            f"SELECT file FROM {table}.metadata_log_entries",
        )
        for r in spark.sql(query).collect()
    }
    named = {local_path(p) for p in named}
    root = Path(local_path(str(load_iceberg_table(spark, table).location())))
    found = set()
    for p in root.rglob("*"):
        # Hadoop's checksum `.<name>.crc` goes with its file: litter once that is gone
        of = p.with_name(p.name[1:].removesuffix(".crc")) if p.name.startswith(".") else p
        if p.is_file() and (str(of) not in named if of == p else not of.exists()):
            found.add(str(p))
    return found


def litter(spark, pipeline) -> set[str]:
    return {f for t in side_tables(spark, pipeline) for f in unreferenced(spark, t)}


def start_submit(pipeline, batch: str) -> subprocess.Popen:
    """spark-submit of jobs/load.py with a plan, as the load DAG's task starts it."""
    from cdclake.spark import launch_conf
    from cdclake_control.planner import plan_pipeline

    conf = [x for k, v in launch_conf(pipeline).items() for x in ("--conf", f"{k}={v}")]
    plan = plan_pipeline(pipeline, batch).to_json()
    job = ["--pipeline", str(pipeline.path), "--plan", plan]
    python = sys.executable
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]", *conf]
        + [str(ROOT / "jobs" / "load.py"), *job],
        env={**os.environ, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python},
        # spark-submit's log would fill a pipe nobody reads while the test watches
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def data_files(under: Path) -> set[str]:
    return {str(p) for p in under.rglob("*.parquet") if p.parent.name == "data"}


def kill_mid_write(pipeline, watched: Path, delay_s: float, submit: str | None = None) -> bool:
    """Start `cdclake run` (or, with a batch id, spark-submit of the load job) and SIGKILL
    it `delay_s` after a new data file appears under `watched` (the run is writing, and
    has most likely not committed yet); False when the run finished first. spark-submit
    alone is killed, as SparkSubmitHook.on_kill does: its driver dies with it."""
    before = data_files(watched) if watched.exists() else set()
    proc = start_run(pipeline.path) if submit is None else start_submit(pipeline, submit)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if watched.exists() and data_files(watched) - before:
                time.sleep(delay_s)
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(0.005)
        assert proc.poll() is not None, "the run neither wrote nor ended within 600 s"
        assert proc.returncode == 0, proc.stderr.read()[-3000:] if proc.stderr else submit
        return False
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_killed_loads_files_are_removed_by_maintenance_past_the_bound(stack, spark, tmp_path):
    rng = random.Random(5)
    n = uuid.uuid4().hex[:6]
    table = f"inventory.litter_{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, v text)")
        # a first load above what the driver reads: resolved range by range
        rows = MEASURED.driver_read_records + 2_000
        conn.execute(
            f"insert into {table} select i, md5(i::text) from generate_series(1, %s) i", (rows,)
        )
    stack.wait_for_capture()
    pipeline = make_pipeline(tmp_path, f"it_litter_{n}", [table])
    namespace_dir = Path(local_path(os.environ["CDCLAKE_WAREHOUSE"])) / pipeline.namespace

    # killed while they write: the first load (Spark's append), then two MERGEs, at the
    # deleted-keys ledger's files (`cdclake run`) and at the MERGE's data files and
    # deletion vectors (spark-submit of the load job, as the load task runs it)
    assert kill_mid_write(pipeline, namespace_dir, rng.uniform(0, 0.3))
    load_all(stack, spark, pipeline, f"{n}-a")  # the next load
    killed = litter(spark, pipeline)
    ice = load_iceberg_table(spark, pipeline.qualified_target(pipeline.tables[0]))
    data_dir = Path(local_path(str(ice.location()))) / "data"
    for watched, submit in ((namespace_dir, None), (data_dir, f"{n}-submit")):
        workload(stack.source_dsn, table, 3, rng)
        stack.wait_for_capture()
        assert kill_mid_write(pipeline, watched, rng.uniform(0, 0.3), submit)
        killed |= litter(spark, pipeline)
    workload(stack.source_dsn, table, 2, rng)
    load_all(stack, spark, pipeline, f"{n}-b")  # the next loads: exactly once
    assert_exactly_once(stack, spark, pipeline)
    left = litter(spark, pipeline)
    assert left == killed  # nothing but maintenance removes them
    # the kills left data files (each of the three did when this was written: the
    # append's, the ledger's, the MERGE's with a deletion vector)
    assert any(f.endswith(".parquet") for f in left), left

    # younger than the bound: kept
    figures = run_maintenance(pipeline, spark, run_id=f"{n}-now")["tables"][0]
    assert figures["orphan_files_removed"] == 0
    assert all(os.path.exists(f) for f in left)

    # the clock past the bound: every file no snapshot names is gone, the lake intact
    later = int(time.time() * 1000) + (pipeline.maintenance.orphan_older_than_hours + 1) * HOUR_MS
    figures = run_maintenance(pipeline, spark, run_id=f"{n}-later", now_ms=later)["tables"][0]
    assert figures["orphan_files_removed"] >= len(left)
    assert litter(spark, pipeline) == set()
    assert not any(os.path.exists(f) for f in left)
    assert_lake_equals_source(pipeline, stack.source_dsn)
    workload(stack.source_dsn, table, 1, rng)
    load_all(stack, spark, pipeline, f"{n}-c")
    assert_exactly_once(stack, spark, pipeline)


def test_old_branches_of_loads_are_removed_and_a_load_whose_branch_went_commits_nothing(
    stack, spark, tmp_path
):
    """A load's branch (`cdclake_load_<made ms>_<batch>`) with a commit that main never
    took goes with the maintenance run once made longer ago than the bound (its snapshot
    at once, as no branch reaches it), not sooner, however old the snapshot it stands at;
    a branch named as older versions did is aged by its snapshot. A load whose branch was
    removed while it wrote commits nothing, and its writes find no branch to go to."""
    n = uuid.uuid4().hex[:6]
    table = f"inventory.branches_{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, v text)")
        conn.execute(f"insert into {table} values (1, 'a')")
    pipeline = make_pipeline(tmp_path, f"it_branches_{n}", [table])
    load_all(stack, spark, pipeline, n)
    target = pipeline.qualified_target(pipeline.tables[0])
    now = int(time.time() * 1000)
    later = now + (pipeline.maintenance.orphan_older_than_hours + 1) * HOUR_MS
    killed, old_style = f"{STAGE_PREFIX}{now}_killed_{n}", f"{STAGE_PREFIX}killed_{n}"
    working = f"{STAGE_PREFIX}{later - HOUR_MS}_working_{n}"  # made an hour before `later`
    for name in (killed, old_style, working):
        spark.sql(f"ALTER TABLE {target} CREATE BRANCH {name}")
    commit_empty(spark, target, {SUMMARY_BATCH: "killed"}, branch=killed)

    def branches() -> set[str]:
        refs = spark.sql(f"SELECT name FROM {target}.refs").collect()
        return {r["name"] for r in refs} - {"main"}

    figures = run_maintenance(pipeline, spark)["tables"][0]
    assert figures["dead_load_branches_removed"] == 0
    assert branches() == {killed, old_style, working}
    assert figures["off_main_snapshots_expired"] == 0
    figures = run_maintenance(pipeline, spark, now_ms=later)["tables"][0]
    assert figures["dead_load_branches_removed"] == 2 and branches() == {working}
    assert figures["off_main_snapshots_expired"] == 1  # the killed load's commit
    assert_lake_equals_source(pipeline, stack.source_dsn)
    spark.sql(f"ALTER TABLE {target} DROP BRANCH {working}")

    before_id, _ = current_snapshot(spark, target)
    props = {SUMMARY_BATCH: f"{n}-late"}
    stage = f"{STAGE_PREFIX}{now}_late_{n}"
    with pytest.raises(CommitConflictError, match="was removed while it loaded"):
        with _staged(spark, target, before_id, stage, props):
            spark.sql(f"ALTER TABLE {target} DROP BRANCH {stage}")  # taken for a dead load's
            commit_empty(spark, target, {SUMMARY_BATCH: "other"})  # another run's commit
    # Iceberg refuses a write to a branch that is gone (no new branch on main's snapshot)
    with pytest.raises(Exception, match="Cannot use branch"):
        commit_empty(spark, target, props, branch=stage)
    after_id, summary = current_snapshot(spark, target)
    assert after_id != before_id and summary[SUMMARY_BATCH] == "other"
    assert branches() == set()
