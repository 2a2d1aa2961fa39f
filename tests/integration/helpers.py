"""Helpers for tests on the local stack: pipelines of their own, loading to the end."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from cdclake.config import PipelineConfig
from cdclake.job import run_batch
from cdclake.pipeline_file import load_pipeline
from cdclake.placement import Placement
from cdclake_control.compare import compare_pipeline
from cdclake_control.planner import plan_pipeline

from tests.conftest import DEMO_PIPELINE


def make_pipeline(tmp_path: Path, name: str, tables: list, **fields) -> PipelineConfig:
    """A pipeline like the demo one (same stack, catalog) with its own namespace."""
    raw = yaml.safe_load(DEMO_PIPELINE.read_text())
    raw.update(name=name, namespace=name, tables=tables, **fields)
    raw["catalog"]["warehouse"] = "${CDCLAKE_WAREHOUSE}"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_pipeline(path)


def load_all(stack, spark, pipeline: PipelineConfig, batch: str, placement: str = "auto") -> list:
    """Wait for the capture, then load until nothing is left, resolving where
    `placement` (a `Placement` value) says."""
    stack.wait_for_capture()
    results = []
    for i in range(10):
        plan = plan_pipeline(pipeline, f"{batch}-{i}")
        if not plan.ranges:
            return results
        results.extend(run_batch(spark, pipeline, plan, placement=Placement(placement)))
    raise AssertionError("still loading after 10 batches")


def delete_records(pipeline: PipelineConfig, topic: str, below: int) -> None:
    """What retention does: Kafka's DeleteRecords drops partition 0's records below
    `below`, which becomes its earliest offset."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(pipeline.kafka.client_config())
    (deleted,) = admin.delete_records([TopicPartition(topic, 0, below)]).values()
    assert deleted.result(30).low_watermark == below


def assert_lake_equals_source(pipeline: PipelineConfig, dsn: str) -> None:
    results = compare_pipeline(pipeline, dsn)
    diffs = {r.source: (r.missing[:2], r.extra[:2]) for r in results if not r.equal}
    assert not diffs, diffs


@contextmanager
def concurrent_writes(dsn: str, table: str, low: int, high: int, seed: int) -> Iterator[None]:
    """While the block runs, a thread upserts (and now and then deletes) rows with ids in
    [low, high] of `table` (id int primary key, v int, note text); ids outside that range
    only change by what the block does."""
    import psycopg

    stop = threading.Event()

    def write() -> None:
        rng = random.Random(seed)
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                conn.execute(
                    f"insert into {table} values (%s, 0, 'w') on conflict (id) "
                    "do update set v = excluded.v + 1, note = 'updated'",
                    (rng.randint(low, high),),
                )
                if rng.random() < 0.1:
                    conn.execute(f"delete from {table} where id = %s", (rng.randint(low, high),))
                time.sleep(0.002)  # a steady stream the capture keeps up with, not a flood

    writer = threading.Thread(target=write)
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join()


def assert_resolved_in(results: list, *where: str) -> None:
    """The tables that loaded something were decoded and resolved in exactly these
    places ("driver", "ranges")."""
    used = {r.table: r.resolved_by for r in results if r.resolved_by}
    assert used and set(used.values()) == set(where), used


def stray_files(spark, table: str) -> list[str]:
    """The files under the table's data directory that none of its snapshots names (what
    a load left behind)."""
    from cdclake.iceberg.tables import load_iceberg_table

    spark.sql(f"REFRESH TABLE {table}")  # another process may have committed since
    data = Path(local_path(str(load_iceberg_table(spark, table).location()))) / "data"
    named = {local_path(r.file_path) for r in spark.sql(
        f"SELECT file_path FROM {table}.all_files").collect()}  # fmt: skip
    return sorted(str(p) for p in data.rglob("*.parquet") if str(p) not in named)


def local_path(uri: str) -> str | None:
    """The local path of a `file:` URI (or of a bare absolute path); None for any other
    location."""
    from urllib.parse import unquote, urlsplit

    if uri.startswith("/"):
        return uri
    parts = urlsplit(uri)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        return None
    return unquote(parts.path)
