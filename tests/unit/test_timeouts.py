"""The pipeline file's `timeouts:` and where the clients built from a pipeline take them."""

from pathlib import Path

import pytest
from cdclake.config import TimeoutsConfig
from cdclake.exceptions import ConfigError
from cdclake.iceberg.catalog import catalog_endpoint, sqlalchemy_uri
from cdclake.pipeline_file import load_pipeline
from cdclake.spark import catalog_spark_conf
from cdclake_control.source import describe_dsn

PIPELINE = """
name: shop
topic_prefix: pg
kafka: {bootstrap_servers: "top:9092", properties: {security.protocol: SSL}}
catalog: {name: lake, type: jdbc, uri: "jdbc:postgresql://db:5433/cat", warehouse: wh,
          properties: {jdbc.user: u, jdbc.password: "p w"}}
namespace: shop
tables: [public.orders]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


def test_defaults_bound_every_client(tmp_path):
    p = load_pipeline(write(tmp_path, PIPELINE))
    assert p.timeouts == TimeoutsConfig(connect_s=10.0, request_s=30.0)
    assert p.kafka.timeouts is p.timeouts and p.catalog.timeouts is p.timeouts
    config = p.kafka.client_config()
    assert config["socket.connection.setup.timeout.ms"] == "10000"
    assert config["socket.timeout.ms"] == "30000"
    assert config["security.protocol"] == "SSL"


def test_timeouts_are_read_from_the_pipeline_file(tmp_path, monkeypatch):
    monkeypatch.setenv("REQUEST_S", "45")
    text = PIPELINE + "timeouts: {connect_s: 2.5, request_s: '${REQUEST_S}'}\n"
    p = load_pipeline(write(tmp_path, text))
    assert p.timeouts == TimeoutsConfig(connect_s=2.5, request_s=45.0)
    assert p.kafka.client_config()["socket.connection.setup.timeout.ms"] == "2500"
    assert p.kafka.client_config()["socket.timeout.ms"] == "45000"
    assert "connect_timeout=2&" in sqlalchemy_uri(p.catalog)  # libpq counts whole seconds
    assert "statement_timeout%3D45000" in sqlalchemy_uri(p.catalog)


@pytest.mark.parametrize(
    "section, field, problem",
    [
        ("{connect_s: 0}", "timeouts.connect_s", "> 0"),  # zero waits for nothing
        ("{request_s: -1}", "timeouts.request_s", "> 0"),  # negative
        ("{request_s: .inf}", "timeouts.request_s", "> 0"),  # unbounded
        ("{connect_s: soon}", "timeouts.connect_s", "number of seconds"),  # not a number
        ("{connect_s: true}", "timeouts.connect_s", "number of seconds"),  # a bool is no number
        ("{connect_s: [1]}", "timeouts.connect_s", "number of seconds"),  # a list
        ("{connect: 5}", "timeouts.connect", "unknown key"),  # misspelt key
        ("[10, 30]", "timeouts", "must be a mapping"),  # not a mapping
    ],
)
def test_bad_timeouts_name_file_and_field(tmp_path, section, field, problem):
    path = write(tmp_path, PIPELINE + f"timeouts: {section}\n")
    with pytest.raises(ConfigError) as err:
        load_pipeline(path)
    assert str(err.value).startswith(f"{path}: {field}: ")
    assert problem in str(err.value)


def test_kafka_properties_override_the_servers_named_and_the_timeouts(tmp_path):
    text = PIPELINE.replace(
        "{security.protocol: SSL}",
        "{bootstrap.servers: 'used:9093', socket.timeout.ms: 5000}",
    )
    kafka = load_pipeline(write(tmp_path, text)).kafka
    assert kafka.bootstrap_servers == "top:9092"
    assert kafka.servers == "used:9093"  # what errors name: what the clients used
    assert kafka.client_config()["socket.timeout.ms"] == "5000"


def test_catalog_clients_take_the_timeouts(tmp_path):
    p = load_pipeline(write(tmp_path, PIPELINE + "timeouts: {connect_s: 4, request_s: 20}\n"))
    uri = sqlalchemy_uri(p.catalog)
    assert uri.startswith("postgresql+psycopg://u:p%20w@db:5433/cat?")
    assert "connect_timeout=4" in uri
    conf = catalog_spark_conf(p.catalog)
    assert conf["spark.sql.catalog.lake.jdbc.loginTimeout"] == "4"
    assert conf["spark.sql.catalog.lake.jdbc.socketTimeout"] == "20"
    rest = load_pipeline(
        write(
            tmp_path,
            PIPELINE.replace("type: jdbc", "type: rest").replace(
                "jdbc:postgresql://db:5433/cat", "http://rest:8181"
            ),
        )  # fmt: skip
    )
    conf = catalog_spark_conf(rest.catalog)
    assert conf["spark.sql.catalog.lake.rest.client.connection-timeout-ms"] == "10000"
    assert conf["spark.sql.catalog.lake.rest.client.socket-timeout-ms"] == "30000"
    assert catalog_endpoint(rest.catalog) == "rest:8181"
    assert catalog_endpoint(p.catalog) == "db:5433"


@pytest.mark.parametrize(
    "dsn, named",
    [
        ("host=db port=6543 dbname=inv user=u password=secret", "db:6543/inv"),  # key=value
        ("postgresql://u:secret@db:6543/inv", "db:6543/inv"),  # URI
        ("host=db dbname=inv password=secret", "db:5432/inv"),  # default port
    ],
)
def test_a_source_dsn_is_named_without_its_password(dsn, named):
    assert describe_dsn(dsn) == named


def test_the_schema_registry_waits_the_request_timeout(tmp_path):
    text = PIPELINE.replace(
        "properties: {security.protocol: SSL}",
        "format: avro, schema_registry: {url: 'http://registry:8080/'}",
    )
    registry = load_pipeline(
        write(tmp_path, text + "timeouts: {request_s: 7}\n")
    ).kafka.schema_registry
    assert (registry.url, registry.timeout_s) == ("http://registry:8080", 7.0)


def test_every_spark_task_ends_before_maintenance_may_take_its_files():
    """Every Spark task of the DAGs writes data files, and maintenance removes unreferenced
    ones older than `orphan_older_than_hours` (at least ORPHAN_MIN_HOURS): each task's
    execution timeout ends it before any file it may still commit is that old."""
    import datetime as dt

    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from cdclake.config_fields import ORPHAN_MIN_HOURS
    from cdclake_airflow.factory import build_pipeline_dag, spark_submit
    from cdclake_airflow.maintenance import MAINTAIN_APPLICATION, build_maintenance_dag
    from cdclake_airflow.manual import (
        build_backfill_dag,
        build_dead_letters_dag,
        build_snapshot_dag,
    )

    from tests.conftest import DEMO_PIPELINE

    demo = load_pipeline(DEMO_PIPELINE)
    pipelines, choices = {"demo": demo}, {"demo": [t.source for t in demo.tables]}
    dags = [
        build_pipeline_dag(demo),
        build_maintenance_dag(demo),
        build_backfill_dag(pipelines, choices),
        build_snapshot_dag(pipelines, choices),
        build_dead_letters_dag(pipelines),
    ]
    spark_tasks = [t for d in dags for t in d.tasks if isinstance(t, SparkSubmitOperator)]
    assert {t.task_id for t in spark_tasks} == {
        "load",
        "maintain",
        "load__demo",
        "dead_letters__demo",
    }
    limit = dt.timedelta(hours=ORPHAN_MIN_HOURS)
    assert all(dt.timedelta(0) < t.execution_timeout < limit for t in spark_tasks)
    for timeout in (limit, dt.timedelta(0)):  # a day, or none: refused when the DAG is built
        with pytest.raises(ValueError, match="orphan_older_than_hours"):
            spark_submit(
                demo,
                task_id="t",
                application=MAINTAIN_APPLICATION,
                application_args=[],
                name="t",
                timeout=timeout,
            )
