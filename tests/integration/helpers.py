"""Helpers for tests on the local stack: pipelines of their own, loading to the end."""

from __future__ import annotations

from pathlib import Path

import yaml
from cdclake.compare import compare_pipeline
from cdclake.config import PipelineConfig, load_pipeline
from cdclake.job import run_batch
from cdclake.planner import plan_pipeline

from tests.conftest import DEMO_PIPELINE


def make_pipeline(tmp_path: Path, name: str, tables: list, **fields) -> PipelineConfig:
    """A pipeline like the demo one (same stack, catalog) with its own namespace."""
    raw = yaml.safe_load(DEMO_PIPELINE.read_text())
    raw.update(name=name, namespace=name, tables=tables, **fields)
    raw["catalog"]["warehouse"] = "${CDCLAKE_WAREHOUSE}"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_pipeline(path)


def load_all(stack, spark, pipeline: PipelineConfig, batch: str) -> list:
    """Wait for the capture, then load until nothing is left."""
    stack.wait_for_capture()
    results = []
    for i in range(10):
        plan = plan_pipeline(pipeline, f"{batch}-{i}")
        if not plan.ranges:
            return results
        results.extend(run_batch(spark, pipeline, plan))
    raise AssertionError("still loading after 10 batches")


def assert_lake_equals_source(pipeline: PipelineConfig, dsn: str) -> None:
    results = compare_pipeline(pipeline, dsn)
    diffs = {r.source: (r.missing[:2], r.extra[:2]) for r in results if not r.equal}
    assert not diffs, diffs
