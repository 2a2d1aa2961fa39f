"""docker-compose.yaml checked offline: valid against the Compose Specification schema,
every referenced file present, every image tag pinned, the pipeline configs valid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cdclake.config import load_pipeline

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
        "postgres", "kafka", "connect", "connect-register", "minio", "iceberg-rest",
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


def test_compose_pipeline_configs_are_valid(monkeypatch):
    monkeypatch.delenv("CDCLAKE_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.delenv("CDCLAKE_CATALOG_URI", raising=False)
    for path in (ROOT / "docker" / "pipelines").glob("*.yaml"):
        pipeline = load_pipeline(path)
        assert pipeline.catalog.type == "rest"
        assert pipeline.kafka.bootstrap_servers == "kafka:9092"
