"""No litter: the data files of a load killed before its commit are removed by the next
load (`cdclake.iceberg.leases`), never those of a load still at work."""

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
from cdclake.iceberg.leases import LEASE_DIR, Leases, lease_name, process_space
from cdclake.iceberg.tables import STAGE_PREFIX, deleted_keys_table, load_iceberg_table
from cdclake.placement import MEASURED

from tests.conftest import ROOT
from tests.integration.helpers import (
    assert_lake_equals_source,
    load_all,
    local_path,
    make_pipeline,
    stray_files,
)
from tests.integration.test_faults import start_run, workload

pytestmark = pytest.mark.integration


def table_dir(spark, target: str) -> Path:
    return Path(local_path(str(load_iceberg_table(spark, target).location())))


def lease_files(spark, target: str) -> list[str]:
    root = table_dir(spark, target) / LEASE_DIR
    return sorted(p.name for p in root.glob("*") if not p.name.startswith("."))


def data_files(under: Path) -> set[str]:
    return {str(p) for p in under.rglob("*.parquet") if p.parent.name == "data"}


def start_submit(pipeline, batch: str) -> subprocess.Popen:
    """spark-submit of jobs/load.py with a plan, as the load DAG's task starts it."""
    from cdclake.spark import launch_conf
    from cdclake_control.planner import plan_pipeline

    conf = [x for k, v in launch_conf(pipeline).items() for x in ("--conf", f"{k}={v}")]
    plan = plan_pipeline(pipeline, batch).to_json()
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]", *conf,
         str(ROOT / "jobs" / "load.py"), "--pipeline", str(pipeline.path), "--plan", plan],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable,
             "PYSPARK_DRIVER_PYTHON": sys.executable},
        # spark-submit's log would fill a pipe nobody reads while the test watches
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def kill_at_first_write(pipeline, watched: Path, submit: str | None = None) -> bool:
    """Start `cdclake run` (or, with a batch id, spark-submit of the load job), SIGKILL
    it the moment a new data file appears under `watched` (the run wrote, and has most
    likely not committed yet); False when the run finished first. spark-submit alone is
    killed, as SparkSubmitHook.on_kill does: its driver dies with it."""
    before = data_files(watched) if watched.exists() else set()
    proc = start_run(pipeline.path) if submit is None else start_submit(pipeline, submit)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if watched.exists() and data_files(watched) - before:
                if submit is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
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


def test_killed_loads_leave_no_files_once_the_next_load_ran(stack, spark, tmp_path):
    rng = random.Random(5)
    n = uuid.uuid4().hex[:6]
    table = f"inventory.litter_{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, v text)")
        # a first load above what the driver reads: resolved range by range
        rows = MEASURED.driver_read_records + 2_000
        conn.execute(f"insert into {table} select i, md5(i::text) "
                     f"from generate_series(1, {rows}) i")  # fmt: skip
    stack.wait_for_capture()
    pipeline = make_pipeline(tmp_path, f"it_litter_{n}", [table])
    target = pipeline.qualified_target(pipeline.tables[0])
    namespace_dir = Path(local_path(os.environ["CDCLAKE_WAREHOUSE"])) / pipeline.namespace
    left: list[list[str]] = []  # what each killed run left behind (table and ledger)

    def stray() -> list[str]:
        names = (target, deleted_keys_table(target))
        return [f for t in names if spark.catalog.tableExists(t) for f in stray_files(spark, t)]

    def killed_run(watched: Path, submit: str | None = None) -> None:
        if kill_at_first_write(pipeline, watched, submit):
            found = stray()
            # the killed run found the one before it dead and removed its files first
            assert not left or not set(left[-1]) & set(found), (left[-1], found)
            left.append(found)

    for _ in range(3):  # first loads: Spark's append
        killed_run(namespace_dir)
    load_all(stack, spark, pipeline, f"{n}-a")  # the lake now holds rows to MERGE into
    assert stray() == []
    for r in range(4):  # MERGEs: the ledger's files, Spark's data and delete files
        workload(stack.source_dsn, table, 3, rng)
        stack.wait_for_capture()
        watched = namespace_dir if r == 0 else table_dir(spark, target) / "data"
        killed_run(watched, submit=f"{n}-submit-{r}" if r == 3 else None)
    # kills that did leave files behind (all 7 did when this was written)
    assert sum(1 for s in left if s) >= 5, left

    workload(stack.source_dsn, table, 2, rng)
    stack.wait_for_capture()
    last = start_run(pipeline.path)  # the next load, as a scheduled run starts it
    assert last.wait(timeout=600) == 0, last.stderr.read()[-3000:]
    assert stray() == []  # of the table and of its deleted-keys ledger
    assert lease_files(spark, target) == []  # every dead lease swept, its own released
    assert_lake_equals_source(pipeline, stack.source_dsn)


def test_a_sweep_keeps_the_files_of_a_live_writer(stack, spark, tmp_path):
    """A dead lease makes the next taker delete unreferenced data files older than the
    oldest live writer's start, and no younger one; a writer whose lease is gone may not
    commit."""
    n = uuid.uuid4().hex[:6]
    table = f"inventory.swept_{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, v text)")
        conn.execute(f"insert into {table} values (1, 'a'), (2, 'b')")
    pipeline = make_pipeline(tmp_path, f"it_swept_{n}", [table])
    load_all(stack, spark, pipeline, n)
    target = pipeline.qualified_target(pipeline.tables[0])
    data = table_dir(spark, target) / "data"
    leases = table_dir(spark, target) / LEASE_DIR

    # a load killed on this host: its lease names a process that exited
    gone = subprocess.Popen(["true"])
    gone.wait()
    leases.mkdir(exist_ok=True)
    dead = f"{uuid.uuid4().hex}_{process_space()}_{gone.pid}-1"
    (leases / f"{dead}.start").touch()
    (leases / f"{dead}.live").touch()
    dead_file = data / f"dead-{n}.parquet"
    dead_file.write_bytes(b"PAR1 not committed")
    time.sleep(0.05)

    live = Leases(spark)
    try:
        assert live.take(target) == 1  # the dead load's file: no live writer is older
        assert not dead_file.exists() and not (leases / f"{dead}.start").exists()
        in_flight = data / f"in-flight-{n}.parquet"  # written by the live writer
        in_flight.write_bytes(b"PAR1 not committed yet")
        (leases / f"{dead}.start").touch()  # another dead load
        later = Leases(spark)
        try:
            assert later.take(target) == 0  # younger than the live writer's start: kept
        finally:
            later.close()
        assert in_flight.exists()
        assert stray_files(spark, target) == [str(in_flight)]

        live.check(target)  # its lease stands: it may commit
        started = [p for p in leases.glob("*.start") if live.held[target].name in p.name]
        started[0].unlink()  # a sweep took it for dead
        with pytest.raises(CommitConflictError, match="write lease"):
            live.check(target)
        started[0].touch()
    finally:
        live.close()  # not done: its lease ends dead (.live removed)
    last = Leases(spark)
    last.take(target)  # now nobody is live: the file is a dead writer's
    last.done(target)
    last.close()
    assert stray_files(spark, target) == []
    assert lease_files(spark, target) == []


def branch_with_a_commit(spark, target: str, name: str) -> None:
    """A branch as a load leaves it when killed before main took it: one commit on it."""
    from cdclake.iceberg.tables import commit_empty

    spark.sql(f"ALTER TABLE {target} CREATE BRANCH {name}")
    commit_empty(spark, target, {}, branch=name)


def test_maintenance_removes_what_dead_loads_left(stack, spark, tmp_path):
    """Maintenance takes a lease too: a killed load's files go with its run, counted; its
    branch goes once no other writer is at work; a snapshot on no branch (a run's that
    lost a race) is expired at once, not after the retention."""
    from cdclake.iceberg.maintenance import run_maintenance

    n = uuid.uuid4().hex[:6]
    table = f"inventory.maintained_{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, v text)")
        conn.execute(f"insert into {table} values (1, 'a')")
    pipeline = make_pipeline(tmp_path, f"it_maintained_{n}", [table])
    load_all(stack, spark, pipeline, n)
    target = pipeline.qualified_target(pipeline.tables[0])
    gone = subprocess.Popen(["true"])
    gone.wait()
    leases = table_dir(spark, target) / LEASE_DIR
    leases.mkdir(exist_ok=True)
    dead = f"{uuid.uuid4().hex}_{process_space()}_{gone.pid}-1"
    (leases / f"{dead}.start").touch()
    (leases / f"{dead}.live").touch()
    left = table_dir(spark, target) / "data" / f"killed-{n}.parquet"
    left.write_bytes(b"PAR1 not committed")
    os.utime(left, (time.time() - 60, time.time() - 60))
    killed, lost = f"{STAGE_PREFIX}killed_{n}", f"{STAGE_PREFIX}lost_{n}"
    branch_with_a_commit(spark, target, killed)
    branch_with_a_commit(spark, target, lost)
    spark.sql(f"ALTER TABLE {target} DROP BRANCH {lost}")  # the race's loser removes it
    other = lease_name(process_space(), [os.getpid()])  # another writer, at work
    (leases / f"{other}.live").touch()
    (leases / f"{other}.start").touch()

    def branches() -> set[str]:
        refs = spark.sql(f"SELECT name FROM {target}.refs").collect()
        return {r["name"] for r in refs} - {"main"}

    figures = run_maintenance(pipeline, spark)["tables"][0]
    assert figures["dead_load_files_removed"] == 1 and not left.exists()
    assert figures["off_main_snapshots_expired"] == 1
    assert figures["dead_load_branches_removed"] == 0 and branches() == {killed}  # may be its
    (leases / f"{other}.live").unlink()
    (leases / f"{other}.start").unlink()

    figures = run_maintenance(pipeline, spark)["tables"][0]
    assert figures["dead_load_branches_removed"] == 1 and branches() == set()
    assert figures["off_main_snapshots_expired"] == 1  # the killed load's commit
    assert stray_files(spark, target) == [] and lease_files(spark, target) == []
    assert_lake_equals_source(pipeline, stack.source_dsn)
