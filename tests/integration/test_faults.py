"""Exactly once under faults: the load killed with SIGKILL at random moments, and two loads
of one pipeline at the same time."""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import sys
import time
import uuid

import psycopg
import pytest
from cdclake.iceberg.catalog import load_catalog
from cdclake_control.catalog import table_state
from cdclake_control.watermarks import fetch_watermarks

from tests.conftest import ROOT
from tests.integration.helpers import assert_lake_equals_source, load_all, make_pipeline

pytestmark = pytest.mark.integration
# a kill a round, at a moment drawn over the span of a run (start-up, plan, read, MERGE,
# commit): 12 rounds (a minute on 2 cores), as many moments as a test run can afford
KILL_ROUNDS = 12


def workload(dsn: str, table: str, rounds: int, rng: random.Random) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for r in range(rounds):
            with conn.transaction():
                for _ in range(20):
                    k = rng.randint(1, 60)
                    conn.execute(
                        f"insert into {table} values (%s, %s) on conflict (id) "
                        "do update set v = excluded.v",
                        (k, f"r{r}-{rng.random():.6f}"),
                    )
                conn.execute(f"delete from {table} where id = %s", (rng.randint(1, 60),))


def start_run(pipeline_path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cdclake", "run", "--pipeline", str(pipeline_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def assert_exactly_once(stack, spark, pipeline) -> None:
    target = pipeline.qualified_target(pipeline.tables[0])
    counts = spark.sql(f"select count(*) n, count(distinct id) d from {target}").collect()[0]
    assert counts["n"] == counts["d"]  # no key twice
    assert_lake_equals_source(pipeline, stack.source_dsn)
    state = table_state(load_catalog(pipeline.catalog), pipeline, pipeline.tables[0])
    marks = fetch_watermarks(pipeline.kafka, [pipeline.topic_for(pipeline.tables[0])])
    assert state.offsets == {tp: m.high for tp, m in marks.items()}


def test_killed_loads_leave_old_or_new_state_and_resume(stack, spark, tmp_path):
    rng = random.Random(7)
    n = uuid.uuid4().hex[:6]
    table = f"inventory.faults_{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, v text)")
    pipeline = make_pipeline(tmp_path, f"it_kill_{n}", [table], max_records_per_batch=40)
    # how long one run takes here, so the kills fall anywhere in a run: start-up, plan,
    # read, merge or commit
    workload(stack.source_dsn, table, 2, rng)
    stack.wait_for_capture()
    started = time.monotonic()
    first = start_run(pipeline.path)
    assert first.wait(timeout=600) == 0, first.stderr.read()
    run_s = time.monotonic() - started
    kills = 0
    for _ in range(KILL_ROUNDS):
        workload(stack.source_dsn, table, 2, rng)
        stack.wait_for_capture()
        proc = start_run(pipeline.path)
        time.sleep(rng.uniform(0.05, 0.9) * run_s)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
    assert kills >= KILL_ROUNDS - 2, (
        f"{kills} of {KILL_ROUNDS} runs killed (a run takes {run_s:.1f}s)"
    )
    # catch up in big batches: what the killed runs did not commit is still to load
    load_all(stack, spark, dataclasses.replace(pipeline, max_records_per_batch=100_000), n)
    assert_exactly_once(stack, spark, pipeline)


def test_two_loads_at_once_one_commits_the_other_fails_cleanly(stack, spark, tmp_path):
    rng = random.Random(11)
    n = uuid.uuid4().hex[:6]
    table = f"inventory.twice_{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, v text)")
    workload(stack.source_dsn, table, 5, rng)
    stack.wait_for_capture()
    pipeline = make_pipeline(tmp_path, f"it_twice_{n}", [table])
    procs = [start_run(pipeline.path) for _ in range(2)]
    outcomes = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in outcomes)
    assert codes[0] == 0, outcomes
    for code, err in outcomes:
        if code != 0:
            assert code == 2 and "another run" in err, err
    assert_exactly_once(stack, spark, pipeline)


def test_runs_creating_the_namespace_at_the_same_moment_both_go_on(stack, spark):
    """The JDBC catalog's CREATE NAMESPACE IF NOT EXISTS fails on its unique key when two
    runs create the same namespace at once; the one that lost must still go on."""
    import threading

    from cdclake.iceberg.tables import ensure_namespace

    for _ in range(4):
        namespace = f"lake.it_ns_{uuid.uuid4().hex[:6]}"
        errors: list[BaseException] = []
        start = threading.Barrier(6)

        def create(namespace=namespace, errors=errors, start=start):
            start.wait()
            try:
                ensure_namespace(spark, namespace)
            except Exception as exc:  # collected: a thread's exception is not the test's
                errors.append(exc)

        threads = [threading.Thread(target=create) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, [str(e).splitlines()[1][:300] for e in errors]
        assert spark.sql(f"describe namespace {namespace}").count() > 0
