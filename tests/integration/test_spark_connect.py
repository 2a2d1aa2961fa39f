"""Loads on a Spark Connect server (the local stack's, `cdclake_local.spark_connect`), from
client processes as the CLI and the Airflow task run them: the lake equals the source in
both ways a batch is resolved, a client without the server's token is refused, and killed
clients and a killed server leave offsets and data together."""

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
from cdclake.iceberg.tables import STAGE_PREFIX
from cdclake.spark import REMOTE_ENV, remote_url
from cdclake_local.spark_connect import LocalSparkConnect
from pyiceberg.exceptions import NoSuchTableError

from tests.conftest import ROOT
from tests.integration.helpers import make_pipeline
from tests.integration.test_faults import assert_exactly_once, workload

pytestmark = pytest.mark.integration

# a client process: plan the pipeline's next batch and load it on the server, resolved
# where the second argument says (a `Placement`); prints how each table was resolved
CLIENT = """
import sys
from cdclake.job import run_batch
from cdclake.pipeline_file import load_pipeline
from cdclake.placement import Placement
from cdclake.spark import load_session
from cdclake_control.planner import plan_pipeline

pipeline = load_pipeline(sys.argv[1])
plan = plan_pipeline(pipeline, sys.argv[3])
if plan.ranges:
    results = run_batch(load_session(pipeline), pipeline, plan, placement=Placement(sys.argv[2]))
    print(" ".join(sorted({r.resolved_by for r in results})))
"""


@pytest.fixture
def server(spark_connect):
    return spark_connect


def client(server: LocalSparkConnect, pipeline_path, placement: str, batch: str):
    env = {**os.environ, REMOTE_ENV: server.remote}
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(pipeline_path), placement, batch], cwd=ROOT,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def load_to_the_end(server, pipeline, placement: str, batch: str) -> set[str]:
    ways = set()
    for i in range(20):
        proc = client(server, pipeline.path, placement, f"{batch}-{i}")
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        if not out.strip():
            return ways
        ways.update(out.split())
    raise AssertionError("still loading after 20 batches")


def new_table(stack, name: str) -> str:
    table = f"inventory.{name}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, v text)")
    return table


def test_loads_on_the_server_equal_the_source(stack, spark, server, tmp_path):
    """Batches resolved in the client (the driver's way), then range by range in the
    server's executors."""
    n = uuid.uuid4().hex[:6]
    table = new_table(stack, f"sc_{n}")
    pipeline = make_pipeline(tmp_path, f"it_sc_{n}", [table], max_records_per_batch=30)
    rng = random.Random(3)
    for placement in ("driver", "ranges"):
        workload(stack.source_dsn, table, 2, rng)
        with psycopg.connect(stack.source_dsn, autocommit=True) as conn:  # a key change
            low = f"(select min(id) from {table})"
            conn.execute(f"update {table} set id = id + 1000 where id = {low}")
        stack.wait_for_capture()
        ways = load_to_the_end(server, pipeline, placement, f"{n}-{placement}")
        assert ways == {placement}
        assert_exactly_once(stack, spark, pipeline)


def test_a_client_without_the_servers_token_is_refused(server):
    code = "from pyspark.sql import SparkSession\nSparkSession.builder.remote(%r).create()"
    code += ".sql('select 1').collect()"
    for url in (f"sc://127.0.0.1:{server.port}", remote_url("127.0.0.1", server.port, "x" * 32)):
        done = subprocess.run(
            [sys.executable, "-c", code % url], capture_output=True, text=True, timeout=120
        )
        assert done.returncode != 0
        assert "missing or wrong x-cdclake-token" in done.stderr


def load_branches(pipeline) -> set[str]:
    """The table's branches of loads (`cdclake_load_*`), killed loads' among them."""
    ident = (pipeline.namespace, pipeline.tables[0].target)
    try:
        refs = load_catalog(pipeline.catalog).load_table(ident).metadata.refs
    except NoSuchTableError:
        return set()
    return {name for name in refs if name.startswith(STAGE_PREFIX)}


def mid_commit(pipeline, proc: subprocess.Popen, before: set[str], timeout: float = 120) -> bool:
    """Wait until the client's batch made its branch (its writes and summary go there
    before main takes them); False when the client ended first."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if load_branches(pipeline) - before:
            return True
        time.sleep(0.05)
    return False


def test_killed_clients_and_a_killed_server_keep_offsets_and_data_together(
    stack, spark, server, tmp_path
):
    """Each round kills the client or the server while the batch's branch exists (its
    data written or being written, main not yet moved)."""
    n = uuid.uuid4().hex[:6]
    table = new_table(stack, f"sc_kill_{n}")
    pipeline = make_pipeline(tmp_path, f"it_sc_kill_{n}", [table], max_records_per_batch=40)
    rng = random.Random(11)
    workload(stack.source_dsn, table, 2, rng)
    load_to_the_end(server, pipeline, "driver", f"{n}-first")
    killed = {"client": 0, "server": 0}
    for i, victim in enumerate(("client", "server", "client")):
        workload(stack.source_dsn, table, 2, rng)
        stack.wait_for_capture()
        before = load_branches(pipeline)
        proc = client(server, pipeline.path, "driver", f"{n}-{i}")
        if mid_commit(pipeline, proc, before):
            pid = server.pid() if victim == "server" else proc.pid
            os.killpg(pid, signal.SIGKILL)
            killed[victim] += 1
        started = time.monotonic()
        proc.wait(timeout=600)
        gave_up_s = time.monotonic() - started
        if victim == "server":
            server.start()  # before the checks, for the tests after this one
            # the client gave up on its own, bounded (CONNECT_RETRIES: ~10 s a call)
            assert proc.returncode != 0 and gave_up_s < 120, gave_up_s
    assert killed == {"client": 2, "server": 1}, killed
    bigger = dataclasses.replace(pipeline, max_records_per_batch=100_000)
    load_to_the_end(server, bigger, "driver", f"{n}-end")
    assert_exactly_once(stack, spark, pipeline)
