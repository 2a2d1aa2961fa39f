"""Shared fixtures. The test stack has its own state directory and ports, so a demo stack
(`make demo`) and the tests never touch each other's data."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEST_STATE = Path(os.environ.get("CDCLAKE_TEST_STATE_DIR", ROOT / ".cdclake" / "test"))
PG_PORT = os.environ.get("CDCLAKE_TEST_PG_PORT", "25442")
KAFKA_PORT = os.environ.get("CDCLAKE_TEST_KAFKA_PORT", "19102")

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
def pipeline():
    from cdclake.pipeline_file import load_pipeline

    return load_pipeline(DEMO_PIPELINE)


@pytest.fixture(scope="session")
def spark(pipeline):
    """One SparkSession for the whole run (a JVM holds one SparkContext)."""
    from cdclake.spark import build_session

    session = build_session(pipeline, "local[2]")
    yield session
    session.stop()


@pytest.fixture(params=["driver", "ranges", "tasks"])
def resolve_in(request):
    """Run the test three times, once per `Placement` a batch can be resolved in: in the
    driver (small batches, the default); range by range in the Spark tasks that read
    them (bigger ones); in Spark tasks over all the records of their keys (what a topic
    the ranges cannot take goes to). Tests pass it to the load
    (`load_all(..., resolve_in)`)."""
    return request.param
