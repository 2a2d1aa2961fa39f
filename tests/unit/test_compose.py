"""docker-compose.yaml checked offline: valid against the Compose Specification schema,
every referenced file present, every image tag pinned, the pipeline configs valid, the
same Kafka and Debezium versions and connector configuration as the local stack."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from cdclake.pipeline_file import load_pipeline

from tests.conftest import ROOT

COMPOSE = ROOT / "docker-compose.yaml"
SCHEMA = Path(__file__).resolve().parents[1] / "data" / "compose-spec.json"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_file_matches_the_compose_specification(compose):
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(compose), key=str)
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]


def test_topology_has_every_production_part(compose):
    services = set(compose["services"])
    assert {
        "postgres", "kafka", "connect", "connect-register", "s3", "iceberg-rest",
        "spark-master", "spark-worker", "airflow-api-server", "airflow-scheduler",
        "airflow-dag-processor", "airflow-triggerer",
    } <= services  # fmt: skip
    assert "wal_level=logical" in compose["services"]["postgres"]["command"]
    # loads run through spark-submit from the Airflow workers: no long-lived load driver
    commands = [svc.get("command") or "" for svc in compose["services"].values()]
    commands = [c if isinstance(c, str) else " ".join(map(str, c)) for c in commands]
    assert not [c for c in commands if "cdclake serve" in c]


def test_images_are_pinned(compose):
    for name, svc in compose["services"].items():
        image = svc.get("image")
        assert image, f"{name} has no image"
        tag = image.rsplit(":", 1)[-1] if ":" in image.split("/")[-1] else ""
        assert tag and tag != "latest", f"{name}: image {image!r} is not pinned to a tag"


def test_every_referenced_file_exists(compose):
    for name, svc in compose["services"].items():
        build = svc.get("build")
        if build:
            context = ROOT / build.get("context", ".")
            assert context.is_dir(), f"{name}: build context {context}"
            assert (context / build.get("dockerfile", "Dockerfile")).is_file(), name
        for volume in svc.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name}: {source} does not exist"


def test_connector_registration_configures_signals_and_notifications():
    config = json.loads((ROOT / "docker" / "debezium" / "inventory-connector.json").read_text())
    assert config["plugin.name"] == "pgoutput"
    assert config["signal.data.collection"] == "public.debezium_signal"
    assert "sink" in config["notification.enabled.channels"]
    assert config["notification.sink.topic.name"]
    assert config["value.converter.schemas.enable"] == "true"


def test_compose_pipeline_configs_are_valid(monkeypatch, compose):
    monkeypatch.delenv("CDCLAKE_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setenv("SPARK_AUTH_SECRET", "a-secret")
    monkeypatch.delenv("CDCLAKE_CATALOG_URI", raising=False)
    airflow = compose["services"]["airflow-scheduler"]["environment"]
    for path in (ROOT / "docker" / "pipelines").glob("*.yaml"):
        pipeline = load_pipeline(path)
        assert pipeline.catalog.type == "rest"
        assert pipeline.kafka.bootstrap_servers == "kafka:9092"
        # every Airflow connection the pipeline names is defined for Airflow's services
        conns = [pipeline.spark.conn_id, pipeline.source.conn_id]
        conns += [pipeline.watch.conn_id] if pipeline.watch else []
        missing = [c for c in conns if f"AIRFLOW_CONN_{c.upper()}" not in airflow]
        assert not missing, f"{path.name}: no connection {missing} in docker-compose.yaml"


def test_every_endpoint_asks_for_a_login(compose):
    """Kafka's listeners, Connect's REST API and Kafka clients, Spark's master and workers:
    each asks for a login; only loopback ports are published, and nothing that takes no
    login (the REST catalog fixture, Spark's web UIs) is."""
    services, configs = compose["services"], compose["configs"]
    kafka = services["kafka"]["environment"]
    protocols = dict(p.split(":") for p in kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    listeners = dict(x.split("://") for x in kafka["KAFKA_LISTENERS"].split(","))
    assert set(protocols.values()) == {"SASL_PLAINTEXT"}, protocols
    assert listeners["CONTROLLER"].startswith("localhost:")  # the node's own
    assert "user_cdclake=" in configs["kafka-jaas"]["content"]
    assert "--command-config" in services["kafka"]["healthcheck"]["test"][1]
    connect = services["connect"]["environment"]
    assert connect["CONNECT_REST_EXTENSION_CLASSES"].endswith(".BasicAuthSecurityRestExtension")
    assert "cdclake=" in configs["connect-users"]["content"]
    for client in ("", "PRODUCER_", "CONSUMER_", "ADMIN_"):
        assert connect[f"CONNECT_{client}SECURITY_PROTOCOL"] == "SASL_PLAINTEXT", client
        assert "PlainLoginModule" in connect[f"CONNECT_{client}SASL_JAAS_CONFIG"], client
        assert f"CONNECT_{client}SASL_JAAS_CONFIG" in connect["SENSITIVE_PROPERTIES"], client
    register = services["connect-register"]["command"][-1]
    assert "-u " in register and "-u " in services["connect"]["healthcheck"]["test"][1]
    connector = json.loads((ROOT / "docker" / "debezium" / "inventory-connector.json").read_text())
    assert connector["signal.consumer.security.protocol"] == "SASL_PLAINTEXT"
    assert connector["signal.consumer.sasl.jaas.config"] == "${env:KAFKA_LOGIN}"
    for name in ("spark-master", "spark-worker"):
        assert "--properties-file" in services[name]["command"], name
    assert "spark.authenticate true" in configs["spark-auth"]["content"]
    pipeline = yaml.safe_load((ROOT / "docker" / "pipelines" / "inventory.yaml").read_text())
    assert pipeline["spark"]["conf"]["spark.authenticate"] == "true"
    assert pipeline["kafka"]["properties"]["security.protocol"].endswith(":-SASL_PLAINTEXT}")
    published = {n: s["ports"] for n, s in services.items() if s.get("ports")}
    assert not {n for n, ports in published.items() if not all(
        str(p).startswith("127.0.0.1:") for p in ports)}, published  # fmt: skip
    assert not {"iceberg-rest", "spark-master", "spark-worker", "spark-connect"} & set(published), (
        published
    )
    server = services["spark-connect"]
    assert "CDCLAKE_CONNECT_TOKEN" in server["environment"]
    script = (ROOT / "docker" / "spark" / "connect-server.sh").read_text()
    assert "spark.connect.grpc.interceptor.classes=cdclake.ConnectGuard" in script
    assert "--properties-file /opt/spark-auth.conf" in script
    conn = json.loads(compose["x-airflow"]["environment"]["AIRFLOW_CONN_CDCLAKE_SPARK_CONNECT"])
    assert conn["conn_type"] == "spark_connect" and conn["password"]


def pom_version(part: str, prop: str) -> str:
    """The pinned version `prop` of the local stack's POM stack/<part>/pom.xml."""
    path = ROOT / "stack" / part / "pom.xml"
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = ET.parse(path).getroot().find(f"m:properties/m:{prop}", ns)
    assert node is not None and node.text, f"{path}: no <{prop}> under <properties>"
    return node.text.strip()


def image(compose: dict, service: str) -> tuple[str, str]:
    name, _, tag = compose["services"][service]["image"].rpartition(":")
    return name, tag


def test_kafka_and_debezium_images_are_the_local_stack_versions(compose):
    """One source of versions: the POMs the local stack resolves from Maven Central."""
    assert image(compose, "kafka") == ("apache/kafka", pom_version("kafka", "kafka.version"))
    assert image(compose, "connect") == (
        "quay.io/debezium/connect", pom_version("debezium", "debezium.version"))  # fmt: skip


def test_iceberg_versions_are_the_local_stacks(compose):
    """The REST catalog image and the jars the compose pipeline asks Spark for are the
    Iceberg version of the local stack's REST catalog and Spark jars."""
    version = pom_version("spark", "iceberg.version")
    assert pom_version("rest-catalog", "iceberg.version") == version
    assert image(compose, "iceberg-rest") == ("apache/iceberg-rest-fixture", version)
    pipeline = yaml.safe_load((ROOT / "docker" / "pipelines" / "inventory.yaml").read_text())
    packages = pipeline["spark"]["conf"]["spark.jars.packages"].split(",")
    assert packages and {p.rsplit(":", 1)[1] for p in packages} == {version}, packages


def test_the_object_store_is_the_local_stacks(compose):
    """The local stack's S3 store and version (Apache-2.0; never MinIO, which is AGPL)."""
    from cdclake_local.objectstore import VERSION

    images = [svc.get("image", "") for svc in compose["services"].values()]
    assert not [i for i in images if "minio" in i.lower()], images
    assert image(compose, "s3") == ("versity/versitygw", VERSION)
    rest = compose["services"]["iceberg-rest"]["environment"]
    assert rest["CATALOG_S3_ENDPOINT"] == "http://s3:7070"
    assert "s3-bucket" in compose["services"]["iceberg-rest"]["depends_on"]


# What the local stack changes in docker-compose's connector configuration: its endpoints,
# names (one connector per prefix beside others on one source) and, since its tests create
# tables while the connector runs, a publication of all tables; and the SASL login of
# Debezium's Kafka signal consumer (the local broker asks for one).
LOCAL_OVERRIDES = {
    "database.hostname", "database.port", "database.password", "database.dbname",
    "topic.prefix", "slot.name", "publication.name", "publication.autocreate.mode",
    "signal.kafka.topic", "signal.kafka.bootstrap.servers", "signal.kafka.groupId",
    "notification.sink.topic.name", "signal.consumer.security.protocol",
    "signal.consumer.sasl.mechanism", "signal.consumer.sasl.jaas.config",
}  # fmt: skip


def test_compose_registers_the_connector_configuration_the_local_stack_uses(compose):
    from cdclake_local.connect import CONNECTOR_JSON, connector_config

    register = compose["services"]["connect-register"]
    mounted = {v.split(":")[1]: ROOT / v.split(":")[0] for v in register["volumes"]}
    command = " ".join(register["command"])
    sent = next(path for target, path in mounted.items() if f"@{target}" in command)
    assert sent.resolve() == CONNECTOR_JSON.resolve()
    composed = json.loads(sent.read_text())
    assert f"/connectors/{composed['topic.prefix']}/config" in command
    login = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": "${file:/state/connect/kafka-login.properties:sasl.jaas.config}",
    }
    local = connector_config("demo", 25432, "inventory", "127.0.0.1:19092", None, login)
    assert local["signal.consumer.sasl.mechanism"] == "PLAIN"
    assert set(composed) <= set(local), set(composed) - set(local)
    changed = {k for k in local if composed.get(k) != local[k]}
    assert changed <= LOCAL_OVERRIDES, changed - LOCAL_OVERRIDES
