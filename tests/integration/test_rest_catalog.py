"""A pipeline on an Iceberg REST catalog whose warehouse is on S3: Iceberg's REST catalog
server and an S3 store (versitygw) of the local stack, both requiring nothing but what the
pipeline file names through environment variables. Planned from snapshot summaries with
pyiceberg (over REST and S3), loaded and maintained by spark-submit of the jobs the DAGs
run, compared with the source."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
import yaml
from cdclake.pipeline_file import load_pipeline
from cdclake.spark import launch_conf
from cdclake_control.compare import compare_pipeline
from cdclake_control.planner import plan_pipeline
from cdclake_local.objectstore import (
    ACCESS_KEY_ENV,
    REGION,
    SECRET_KEY_ENV,
    LocalObjectStore,
    S3Credentials,
)
from cdclake_local.rest_catalog import LocalRestCatalog

from tests.conftest import PG_PORT, ROOT, TEST_STATE
from tests.integration.helpers import assert_lake_equals_source

pytestmark = pytest.mark.integration

S3_PORT = int(os.environ.get("CDCLAKE_TEST_S3_PORT", int(PG_PORT) + 30))
REST_PORT = int(os.environ.get("CDCLAKE_TEST_REST_PORT", int(PG_PORT) + 31))
SUBMIT_TIMEOUT_S = 600
# 127.0.0.1 as /proc/net/tcp and tcp6 (an IPv4-mapped address) write it
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F"}


@pytest.fixture(scope="module")
def rest_catalog():
    """The S3 store and the REST catalog on fresh state, with an access key of their own
    in the environment (as a user sets it); stopped afterwards."""
    saved = {k: os.environ.get(k) for k in (ACCESS_KEY_ENV, SECRET_KEY_ENV)}
    os.environ[ACCESS_KEY_ENV] = f"cdclake{secrets.token_hex(4)}"
    os.environ[SECRET_KEY_ENV] = secrets.token_urlsafe(24)
    root = TEST_STATE / "rest-catalog"
    shutil.rmtree(root, ignore_errors=True)
    store = LocalObjectStore(root / "s3", S3_PORT, S3Credentials.from_env())
    catalog = LocalRestCatalog(root / "catalog", REST_PORT, store)
    try:
        started = catalog.start()
        print(f"REST catalog and S3 store answered after {started:.1f}s")
        yield catalog
    finally:
        catalog.stop()
        store.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def listen_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on `port`."""
    found = set()
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def test_the_s3_store_and_the_catalog_listen_on_loopback_only(rest_catalog):
    for port in (rest_catalog.port, rest_catalog.store.port):
        assert listen_addresses(port) and listen_addresses(port) <= LOOPBACK, port


def rest_pipeline(tmp_path: Path, catalog: LocalRestCatalog, name: str, source: str):
    """The demo pipeline's Kafka and source, its lake on the REST catalog and S3."""
    raw = yaml.safe_load((ROOT / "include" / "pipelines" / "demo.yaml").read_text())
    raw.update(name=name, namespace=name, tables=[source])
    raw["catalog"] = {
        "name": "lake",
        "type": "rest",
        "uri": catalog.uri,
        "warehouse": catalog.warehouse,
        "properties": {
            "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
            "s3.endpoint": catalog.store.endpoint,
            "s3.path-style-access": "true",
            "s3.region": REGION,
            "client.region": REGION,
            "s3.access-key-id": f"${{{ACCESS_KEY_ENV}}}",
            "s3.secret-access-key": f"${{{SECRET_KEY_ENV}}}",
        },
    }
    raw["maintenance"] = {"expire_older_than_hours": 0, "retain_last": 1, "min_input_files": 2}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert os.environ[SECRET_KEY_ENV] not in path.read_text()
    return load_pipeline(path)


def submit(pipeline, job: str, *args: str) -> str:
    """spark-submit of jobs/<job> as the DAGs' tasks start it (secrets off its command
    line); its stdout. The secret must not appear in anything it printed."""
    conf = launch_conf(pipeline)
    assert "spark.sql.catalog.lake.s3.secret-access-key" not in conf
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]"]
    cmd += [x for k, v in conf.items() for x in ("--conf", f"{k}={v}")]
    cmd += [str(ROOT / "jobs" / job), "--pipeline", str(pipeline.path), *args]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=SUBMIT_TIMEOUT_S)  # fmt: skip
    assert os.environ[SECRET_KEY_ENV] not in done.stdout + done.stderr
    errors = [x for x in done.stderr.splitlines() if "rror" in x or "xception" in x]
    assert done.returncode == 0, "\n".join([*errors[-20:], done.stdout[-2000:]])
    # Spark's own lines at WARN: only the SparkContext's first ones come before its level
    spark_info = re.compile(r"\d\d/\d\d/\d\d [\d:]+ INFO (?!SparkContext: )")
    assert [x for x in done.stderr.splitlines() if spark_info.match(x)] == []
    return done.stdout


def load(stack, pipeline, batch: str) -> list[dict]:
    """Plan (pyiceberg reads the committed offsets over REST and S3) and load the batch."""
    stack.wait_for_capture()
    plan = plan_pipeline(pipeline, batch)
    assert plan.ranges, "the capture's records should be planned"
    out = submit(pipeline, "load.py", "--plan", plan.to_json())
    [line] = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    return line["tables"]


def sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def test_a_pipeline_on_a_rest_catalog_over_s3_loads_maintains_and_equals_the_source(
    stack, rest_catalog, tmp_path
):
    n = uuid.uuid4().hex[:6]
    source = f"inventory.rest_{n}"
    sql(
        stack.source_dsn,
        f"create table {source} (id int primary key, label text, qty numeric(10, 2), "
        "at timestamptz default now())",
        f"insert into {source} (id, label, qty) select i, 'row ' || i, i * 1.5 "
        "from generate_series(1, 50) i",
    )
    pipeline = rest_pipeline(tmp_path, rest_catalog, f"it_rest_{n}", source)

    first = load(stack, pipeline, "it-rest-0")
    assert [t["status"] for t in first] == ["committed"]
    sql(
        stack.source_dsn,
        f"update {source} set qty = qty + 1, label = 'changed' where id % 3 = 0",
        f"delete from {source} where id in (7, 8)",
        f"update {source} set id = 500 where id = 9",  # a primary-key change
        f"insert into {source} (id, label, qty) values (1000, 'new', 0)",
    )
    second = load(stack, pipeline, "it-rest-1")
    assert [t["status"] for t in second] == ["committed"]
    assert second[0]["deletes"] >= 3
    assert plan_pipeline(pipeline, "it-rest-2").ranges == ()  # offsets read back over REST

    out = submit(pipeline, "maintain.py", "--run-id", "it-rest-m")
    [maintained] = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    [figures] = maintained["tables"]
    assert figures["status"] == "maintained", figures
    assert plan_pipeline(pipeline, "it-rest-3").ranges == ()  # maintenance kept the offsets

    assert_lake_equals_source(pipeline, stack.source_dsn)
    # the table's files are the S3 store's: Parquet data under the warehouse's bucket
    bucket = rest_catalog.store.data / rest_catalog.bucket
    assert list(bucket.rglob("*.parquet")) and list(bucket.rglob("*.metadata.json"))

    # and the comparison sees a change the lake has not loaded yet
    sql(stack.source_dsn, f"update {source} set label = 'unloaded' where id = 1")
    [result] = compare_pipeline(pipeline, stack.source_dsn)
    assert not result.equal
