"""Shared fixtures. The test stack has its own state directory and ports, so a demo stack
(`make demo`) and the tests never touch each other's data."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEST_STATE = Path(os.environ.get("CDCLAKE_TEST_STATE_DIR", ROOT / ".cdclake" / "test"))
PG_PORT = os.environ.get("CDCLAKE_TEST_PG_PORT", "25442")
KAFKA_PORT = os.environ.get("CDCLAKE_TEST_KAFKA_PORT", "19102")
# Each pytest-xdist worker (`make test` runs three) has a stack of its own: its own state
# directory and ports (100 apart), set here for every test module that reads them.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if WORKER and not os.environ.get("CDCLAKE_TEST_WORKER_SHIFTED"):
    _shift = 100 * int(WORKER.removeprefix("gw"))
    TEST_STATE = TEST_STATE.with_name(f"{TEST_STATE.name}-{WORKER}")
    PG_PORT, KAFKA_PORT = str(int(PG_PORT) + _shift), str(int(KAFKA_PORT) + _shift)
    os.environ.update(
        {
            "CDCLAKE_TEST_WORKER_SHIFTED": "1",  # a process started by a test inherits them
            "CDCLAKE_TEST_STATE_DIR": str(TEST_STATE),
            "CDCLAKE_TEST_PG_PORT": PG_PORT,
            "CDCLAKE_TEST_KAFKA_PORT": KAFKA_PORT,
        }
    )

# Set before anything imports Airflow (it reads AIRFLOW_HOME once) or loads a pipeline.
os.environ.update(
    {
        "CDCLAKE_STATE_DIR": str(TEST_STATE),
        "CDCLAKE_PG_PORT": PG_PORT,
        "CDCLAKE_KAFKA_PORT": KAFKA_PORT,
        "CDCLAKE_KAFKA_BOOTSTRAP": f"127.0.0.1:{KAFKA_PORT}",
        "CDCLAKE_CATALOG_URI": f"jdbc:postgresql://127.0.0.1:{PG_PORT}/cdclake_catalog",
        "CDCLAKE_SOURCE_DSN": f"host=127.0.0.1 port={PG_PORT} dbname=inventory user=postgres",
        "CDCLAKE_WAREHOUSE": (TEST_STATE / "warehouse").as_uri(),
        "AIRFLOW_HOME": str(TEST_STATE / "airflow"),
        # the schema registry of the Avro tests (and of the benchmark's smoke test)
        "CDCLAKE_REGISTRY_PORT": os.environ.get(
            "CDCLAKE_TEST_REGISTRY_PORT", str(int(PG_PORT) + 32)
        ),  # fmt: skip
    }
)

# The test stack's Kafka login (SASL/PLAIN; its password made once in the state directory),
# as `cdclake local env` exports it, for the demo pipeline and the tests' clients.
from cdclake_local.broker import LocalBroker  # noqa: E402

os.environ.update(LocalBroker(TEST_STATE / "kafka", int(KAFKA_PORT)).client_env())

# The jars loads add to Spark (stack/spark/pom.xml, resolved from Maven Central once).
if not os.environ.get("CDCLAKE_SPARK_JARS"):
    from cdclake_local.maven import jars

    os.environ["CDCLAKE_SPARK_JARS"] = str(jars("spark"))

# py4j logs from __del__ at interpreter exit, after pytest closed its streams
logging.getLogger("py4j").setLevel(logging.WARNING)

# Seconds each of the slowest files took in a serial run on 2 cores (the other files:
# seconds or less). The workers take files slowest first, so that no long file starts last.
FILE_SECONDS = {
    "bench/test_bench.py": 258,
    "integration/test_semantics.py": 290,
    "integration/test_random_replay.py": 180,
    "integration/test_faults.py": 127,
    "integration/test_spark_connect.py": 185,  # with the server's start (~30 s)
    "e2e/test_watch.py": 200,  # with the Spark Connect DAG's runs
    "e2e/test_airflow_ui.py": 102,
    "integration/test_connector_restarts.py": 91,
    "e2e/test_manual_dags.py": 90,
    "integration/test_bounded_waits.py": 90,
    "integration/test_load.py": 87,
    # after the builds the controller starts (`pytest_sessionstart`): the S3 gateway's
    # (about a minute) and the registry's (about 90 s)
    "integration/test_rest_catalog.py": 80,
    "integration/test_stack.py": 70,
    # 186 s measured on a loaded machine where the version it replaced took 275 (94 here)
    "integration/test_litter.py": 64,
    "unit/test_range_resolve.py": 62,
    "integration/test_spark_cluster.py": 61,
    "integration/test_handling_modes.py": 59,
    "integration/test_bad_input.py": 56,
    "integration/test_kafka.py": 54,
    "integration/test_types.py": 47,
    "integration/test_dead_letter_replay.py": 43,
    "integration/test_maintenance.py": 37,
    "e2e/test_freshness.py": 35,
    "integration/test_avro.py": 31,
    "e2e/test_maintenance_dag.py": 28,
    "e2e/test_demo_dag.py": 26,
    "e2e/test_dagbag.py": 20,
}


def pytest_collection_modifyitems(items):
    """The slowest files first (a stable sort: each file's tests keep their order)."""
    tests = Path(__file__).parent

    def seconds(item) -> int:
        return -FILE_SECONDS.get(item.path.relative_to(tests).as_posix(), 0)

    items.sort(key=seconds)


def pytest_sessionstart(session):
    """With workers (`-n`), the controller builds what tests on both share, once and in
    the background: the Spark driver's class-data-sharing archive (every spark-submit
    of the suite maps it), the S3 gateway and the schema registry. A worker that needs
    one meanwhile waits for its build's lock instead of building it again."""
    if WORKER or not getattr(session.config.option, "numprocesses", None):
        return
    from cdclake_bench.jvm_archive import build_archive
    from cdclake_local import objectstore, registry

    for build in (build_archive, objectstore.gateway_binary, registry.runner):
        threading.Thread(target=_prebuild, args=(build,), daemon=True).start()


def _prebuild(build) -> None:
    try:
        build()
    except Exception:  # noqa: BLE001 - the test that needs it builds it and says why
        logging.getLogger(__name__).warning("prebuild %s failed", build, exc_info=True)


DEMO_PIPELINE = ROOT / "include" / "pipelines" / "demo.yaml"


@pytest.fixture(scope="session")
def stack():
    """The local stack (PostgreSQL, Kafka, Debezium on Kafka Connect, catalog, Airflow home)."""
    from cdclake_local.stack import LocalStack, StackSettings

    local = LocalStack(StackSettings.from_env())
    local.up()
    yield local
    if not os.environ.get("CDCLAKE_KEEP_STACK"):
        local.down()


@pytest.fixture(scope="session")
def spark_connect(stack):
    """A Spark Connect server of the stack's (`cdclake_local.spark_connect`), on a free port."""
    import socket

    from cdclake_local.spark_connect import LocalSparkConnect

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = LocalSparkConnect(stack.s.state_dir / "spark-connect", port)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def pipeline():
    from cdclake.pipeline_file import load_pipeline

    return load_pipeline(DEMO_PIPELINE)


@pytest.fixture(scope="session")
def spark(pipeline):
    """One SparkSession for the whole run (a JVM holds one SparkContext)."""
    from cdclake.spark import build_session

    # the driver JVM of a small batch, as the tests' batches are: the client compiler alone
    # (test_semantics' driver tests: 31 CPU s against 40 with both compilers)
    session = build_session(pipeline, "local[2]", records=1_000)
    yield session
    session.stop()


@pytest.fixture(params=["driver", "ranges"])
def resolve_in(request):
    """Run the test twice, once per `Placement` a batch can be resolved in: in the
    driver (small batches, the default); range by range in the Spark tasks that read
    them (bigger ones). Tests pass it to the load (`load_all(..., resolve_in)`)."""
    return request.param
