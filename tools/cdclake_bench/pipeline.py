"""The pipeline config a benchmark loads with: the local stack's catalog, its own
namespace per run, one table per stream of the workload."""

from __future__ import annotations

import uuid
from pathlib import Path

import yaml
from cdclake.config import PipelineConfig
from cdclake.pipeline_file import load_pipeline
from cdclake_local.stack import StackSettings

from cdclake_bench.events import Workload

# the stack's SASL login, read from the environment (`cdclake local env`), never written
KAFKA_LOGIN = {
    "security.protocol": "${CDCLAKE_KAFKA_SECURITY_PROTOCOL:-PLAINTEXT}",
    "sasl.mechanism": "${CDCLAKE_KAFKA_SASL_MECHANISM:-}",
    "sasl.username": "${CDCLAKE_KAFKA_USER:-}",
    "sasl.password": "${CDCLAKE_KAFKA_PASSWORD:-}",
}


def bench_pipeline(
    work: Path, settings: StackSettings, workload: Workload, label: str,
    spark_conf: dict[str, str] | None = None, fmt: str = "json", registry: str | None = None,
    table_properties: dict[str, str] | None = None, history: bool = False,
) -> PipelineConfig:  # fmt: skip
    """Write and load `<work>/<label>.yaml` (namespace `<label>_<random>`; `fmt`: its
    `kafka.format`; `registry`: the schema registry of an Avro format; `table_properties`:
    every table's `properties`; `history`: every table keeps its history)."""
    prefix = workload.streams[0].topic.split(".", 1)[0]
    tables: list = [s.topic.split(".", 1)[1] for s in workload.streams]
    if table_properties or history:
        tables = [{"source": t, "properties": dict(table_properties or {}), "history": history}
                  for t in tables]  # fmt: skip
    kafka = {"format": fmt, **({"schema_registry": {"url": registry}}
                               if fmt.startswith("avro") else {})}  # fmt: skip
    work.mkdir(parents=True, exist_ok=True)
    return write_pipeline(work / f"{label}.yaml", settings, label, prefix, tables, name="bench",
                          kafka=kafka, spark={"conf": dict(spark_conf or {})})  # fmt: skip


def write_pipeline(
    path: Path, settings: StackSettings, label: str, prefix: str, tables: list, **fields
) -> PipelineConfig:
    """Write and load a pipeline file of the local stack: pipeline `label` (unless `fields`
    names it), namespace `<label>_<random>`, the stack's Kafka and catalog; `fields` add
    to the file's keys (`kafka` and `spark` to those sections)."""
    kafka = {"bootstrap_servers": f"127.0.0.1:{settings.kafka_port}",
             "properties": KAFKA_LOGIN, **fields.pop("kafka", {})}  # fmt: skip
    raw = {
        "name": label,
        "topic_prefix": prefix,
        "kafka": kafka,
        "catalog": {
            "name": "lake",
            "type": "jdbc",
            "uri": f"jdbc:postgresql://127.0.0.1:{settings.pg_port}/{settings.catalog_db}",
            "warehouse": (settings.state_dir / "warehouse").as_uri(),
            "properties": {"jdbc.user": "postgres", "jdbc.password": ""},
        },
        "namespace": f"{label}_{uuid.uuid4().hex[:8]}",
        "max_records_per_batch": 100_000_000,
        "tables": tables,
        "spark": {"master": "local[2]", **fields.pop("spark", {})},
        **fields,
    }
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_pipeline(path)
