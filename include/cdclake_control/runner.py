"""`cdclake run`: plan and load one micro-batch in this process (local or cluster master)."""

from __future__ import annotations

from typing import Any

from cdclake.config import PipelineConfig
from cdclake.job import run_batch
from cdclake.jvm import resolves_by_range
from cdclake.spark import load_session

from cdclake_control.planner import plan_pipeline


def run_once(pipeline: PipelineConfig, batch_id: str | None = None) -> dict[str, Any]:
    """Plan the next batch and load it in this process."""
    plan = plan_pipeline(pipeline, batch_id, pipeline.source.dsn)
    if not plan.ranges:
        return {"pipeline": pipeline.name, "batch_id": plan.batch_id, "tables": []}
    ranged = resolves_by_range(pipeline, plan.ranges)
    spark = load_session(pipeline, pipeline.spark.master, records=plan.total, ranged=ranged)
    results = run_batch(spark, pipeline, plan)
    return {
        "pipeline": pipeline.name,
        "batch_id": plan.batch_id,
        "tables": [r.to_dict() for r in results],
    }
