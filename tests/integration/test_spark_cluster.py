"""Scale-out: the load on a Spark standalone cluster (a master and a worker started from
pyspark's own classes, on loopback, with authentication; two executors of one core)
gives what local mode gives for the same ranges, and the lake equals the source.

The first batch goes through `cdclake run`, master from the pipeline's `spark.master`,
and is big enough for the range tasks: the executors read and resolve it, and write the
keyed table's data files, in the Python the pipeline names (`spark.pyspark.python`, a
wrapper that notes each start). The second goes through the load DAG's task (its
spark-submit, master from its Airflow connection): the driver reads and resolves it, in
this environment's Python, and the executors MERGE it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import secrets
import signal
import stat
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest
from cdclake.job import run_batch
from cdclake.placement import MEASURED
from cdclake_control.planner import plan_pipeline

from tests.conftest import KAFKA_PORT, ROOT
from tests.integration.helpers import assert_lake_equals_source, make_pipeline

pytestmark = pytest.mark.integration

# master, its web UI, worker, its web UI: this port and the next three
SPARK_PORT = int(os.environ.get("CDCLAKE_TEST_SPARK_PORT", int(KAFKA_PORT) + 50))
SECRET_ENV = "CDCLAKE_TEST_SPARK_SECRET"
CONN_ID = "cdclake_test_cluster"
READY_S = 90  # a JVM start on a busy machine
STOP_S = 30
BIG = MEASURED.driver_read_records + 500  # rows: a first load read range by range


@dataclasses.dataclass
class Cluster:
    url: str
    ui: str
    work: Path  # the worker's directory: <app id>/<executor id>/stderr
    logs: Path
    procs: list[subprocess.Popen]

    def state(self) -> dict:
        with urllib.request.urlopen(f"{self.ui}/json/", timeout=2) as answer:
            return json.load(answer)

    def apps(self) -> set[str]:
        return {p.name for p in self.work.iterdir()} if self.work.exists() else set()

    def tasks_per_executor(self, app: str) -> dict[str, int]:
        """How many tasks each executor of `app` started (its log, Spark's INFO level)."""
        return {d.name: (d / "stderr").read_text().count("Running task")
                for d in (self.work / app).iterdir() if d.is_dir()}  # fmt: skip


def _start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip


def _wait_ready(cluster: Cluster) -> None:
    """Until the worker has registered its two cores with the master, at most READY_S."""
    deadline = time.monotonic() + READY_S
    last: object = None
    while time.monotonic() < deadline:
        for proc, name in zip(cluster.procs, ("master", "worker"), strict=False):
            if proc.poll() is not None:
                tail = (cluster.logs / f"{name}.log").read_text()[-3000:]
                raise AssertionError(f"the Spark {name} exited ({proc.returncode}): {tail}")
        try:
            state = cluster.state()
            if state["aliveworkers"] == 1 and state["cores"] == 2:
                return
            last = state
        except OSError as exc:
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"no worker with 2 cores registered within {READY_S} s: {last}")


def _stop(procs: list[subprocess.Popen]) -> None:
    """The worker (with its executors, in its process group), then the master."""
    for proc in reversed(procs):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(STOP_S)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A standalone master and a worker of 2 cores on 127.0.0.1, requiring the shared
    secret (in a file only its owner reads, and in SECRET_ENV for the pipeline)."""
    import pyspark

    home = Path(pyspark.__file__).parent
    root = tmp_path_factory.mktemp("spark-cluster")
    conf_dir, work, logs = root / "conf", root / "work", root / "logs"
    for d in (conf_dir, work, logs):
        d.mkdir()
    secret = secrets.token_hex(24)
    props = conf_dir / "cluster.properties"
    props.touch(mode=0o600)
    # the web UIs (on loopback; standalone has no switch for them) offer no kill buttons;
    # a port taken fails the start instead of moving to the next one
    props.write_text(f"spark.authenticate true\nspark.authenticate.secret {secret}\n"
                     "spark.ui.killEnabled false\nspark.port.maxRetries 0\n")  # fmt: skip
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_CONF_DIR": str(conf_dir),
           "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_MASTER_HOST": "127.0.0.1"}  # fmt: skip
    spark_class = str(home / "bin" / "spark-class")
    url = f"spark://127.0.0.1:{SPARK_PORT}"
    cluster = Cluster(url, f"http://127.0.0.1:{SPARK_PORT + 1}", work, logs, [])
    try:
        cluster.procs.append(_start(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(SPARK_PORT), "--webui-port", str(SPARK_PORT + 1),
             "--properties-file", str(props)], env, logs / "master.log"))  # fmt: skip
        cluster.procs.append(_start(
            [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
             "--port", str(SPARK_PORT + 2), "--webui-port", str(SPARK_PORT + 3),
             "--cores", "2", "--memory", "2g", "--work-dir", str(work),
             "--properties-file", str(props), url], env, logs / "worker.log"))  # fmt: skip
        _wait_ready(cluster)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(SECRET_ENV, secret)
            mp.setenv("SPARK_LOCAL_IP", "127.0.0.1")  # drivers bind loopback too
            mp.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", f"{url}?deploy-mode=client")
            yield cluster
    finally:
        _stop(cluster.procs)


def python_wrapper(where: Path) -> tuple[Path, Path]:
    """An interpreter for the executors: this one, noting its arguments in a file."""
    script, notes = where / "executor-python", where / "executor-python.log"
    script.write_text(f'#!/bin/sh\necho "$*" >> {notes}\nexec {sys.executable} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    notes.touch()
    return script, notes


def cluster_spark(cluster: Cluster, python: Path) -> dict:
    return {
        "conn_id": CONN_ID,
        "master": cluster.url,
        "conf": {
            "spark.executor.cores": "1",
            "spark.cores.max": "2",
            "spark.executor.memory": "1g",
            "spark.driver.host": "127.0.0.1",
            # the first job waits for both executors (at most 30 s)
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.authenticate": "true",
            "spark.authenticate.secret": f"${{{SECRET_ENV}}}",
            "spark.pyspark.python": str(python),
        },
    }


def create_tables(pipeline, dsn: str, names: list[str]) -> None:
    """Topics of two partitions first (the capture keeps them), so that each topic's
    ranges are two tasks."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(pipeline.kafka.client_config())
    topics = [f"{pipeline.topic_prefix}.{name}" for name in names]
    for future in admin.create_topics([NewTopic(t, 2, 1) for t in topics]).values():
        future.result(30)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(f"create table {name} (id int primary key, v text, n int)")


def run_sql(dsn: str, statements: list[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for sql in statements:
            conn.execute(sql)


def submit_load(pipeline, plan, capfd) -> list[dict]:
    """The load DAG's task for `plan` (its spark-submit, master from CONN_ID), run to
    its end; the tables' results the job printed."""
    from cdclake_airflow.factory import load_task

    task = load_task(pipeline, task_id="load", plans=plan.to_json(), name="cdclake-cluster",
                     timeout=dt.timedelta(minutes=5))  # fmt: skip
    assert "spark.authenticate.secret" not in task.conf  # set by the driver itself
    capfd.readouterr()
    task.execute(context={})
    out = "\n".join(capfd.readouterr())
    decoder, found = json.JSONDecoder(), []
    for line in out.splitlines():
        if '{"batch_id"' in line:
            found.append(decoder.raw_decode(line[line.index('{"batch_id"') :])[0])
    assert [r["batch_id"] for r in found] == [plan.batch_id], out[-3000:]
    return found[0]["tables"]


def run_cli(pipeline) -> dict:
    """`cdclake run`: the driver in this process's place, master from `spark.master`."""
    done = subprocess.run([sys.executable, "-m", "cdclake", "run", "--pipeline",
                           str(pipeline.path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def figures(results) -> dict:
    """What a load did to each table, by target name (which differs by namespace only)."""
    rows = [r if isinstance(r, dict) else r.to_dict() for r in results]
    keys = ("status", "records", "upserts", "deletes", "dead_letters", "offsets",
            "resolved_by", "written_by")  # fmt: skip
    return {r["table"].rsplit(".", 1)[1]: {k: r[k] for k in keys} for r in rows}


def assert_scaled_out(cluster: Cluster, app: str, every: bool) -> None:
    """`app` had two executors; both ran tasks (`every`), or at least one did."""
    tasks = cluster.tasks_per_executor(app)
    assert len(tasks) == 2, tasks
    assert all(tasks.values()) if every else any(tasks.values()), tasks


def test_cluster_load_equals_local_mode(stack, spark, cluster, tmp_path, capfd):
    n = uuid.uuid4().hex[:6]
    a, b = f"inventory.scale_{n}_a", f"inventory.scale_{n}_b"
    tables = [a, {"source": b, "partition_by": ["bucket(4, id)"]}]
    python, notes = python_wrapper(tmp_path)
    on_cluster = make_pipeline(tmp_path, f"it_cluster_{n}", tables,
                               spark=cluster_spark(cluster, python))  # fmt: skip
    local = make_pipeline(tmp_path, f"it_local_{n}", tables)
    create_tables(on_cluster, stack.source_dsn, [a, b])
    run_sql(stack.source_dsn, [
        f"insert into {a} select i, md5(i::text), i from generate_series(1, {BIG}) i",
        f"insert into {b} select i, md5(i::text), i from generate_series(1, 1000) i",
        f"update {a} set n = n + 1 where id % 7 = 0",
        f"delete from {a} where id % 11 = 0",
        f"update {a} set id = id + 100000 where id % 13 = 0",  # key changes
    ])  # fmt: skip
    stack.wait_for_capture()

    # a big batch: range tasks read and resolve it
    apps = cluster.apps()
    first = run_cli(on_cluster)["tables"]
    (app,) = cluster.apps() - apps
    assert_scaled_out(cluster, app, every=True)
    started = notes.read_text().splitlines()
    assert any("pyspark.daemon" in line for line in started), started
    plan = plan_pipeline(local, f"{n}-1")  # the same ranges: offsets are compared below
    assert plan.total > MEASURED.driver_read_records and len(plan.ranges) == 4, plan
    assert figures(first) == figures(run_batch(spark, local, plan))
    assert {(f["resolved_by"], f["written_by"]) for f in figures(first).values()} == {
        ("ranges", "append")}  # fmt: skip

    run_sql(stack.source_dsn, [
        f"update {a} set v = v || 'x' where id % 5 = 0",
        f"delete from {a} where id % 17 = 0",
        f"update {a} set id = id + 200000 where id % 19 = 0",
        f"insert into {a} select i, 'new', i from generate_series(300001, 300300) i",
        f"update {b} set n = -n where id % 2 = 0",
        f"delete from {b} where id % 3 = 0",
    ])  # fmt: skip
    stack.wait_for_capture()

    # a small batch: the driver reads and resolves it, the executors MERGE
    plan = plan_pipeline(on_cluster, f"{n}-2")
    assert 0 < plan.total <= MEASURED.driver_read_records, plan
    apps = cluster.apps()
    second = submit_load(on_cluster, plan, capfd)
    (app,) = cluster.apps() - apps
    assert_scaled_out(cluster, app, every=False)
    driver = [line for line in notes.read_text().splitlines() if "load.py" in line]
    assert not driver, "the driver runs this environment's Python (spark.pyspark.driver.python)"
    local_second = run_batch(spark, local, dataclasses.replace(plan, pipeline=local.name))
    assert figures(second) == figures(local_second)
    assert {f["written_by"] for f in figures(second).values()} == {"merge"}

    assert_lake_equals_source(on_cluster, stack.source_dsn)
    assert_lake_equals_source(local, stack.source_dsn)
