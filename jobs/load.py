"""spark-submit entry point: load planned micro-batches of a pipeline.

spark-submit jobs/load.py --pipeline include/pipelines/demo.yaml --plan '<plan JSON>'

`--plan` is one batch plan (scheduled loads) or a JSON list of plans run in order in this
one application (backfills).
"""

import argparse
import json
import sys

from cdclake.job import run_batch
from cdclake.lifecycle import run_job
from cdclake.offsets import plans_from_json
from cdclake.pipeline_file import load_pipeline
from cdclake.spark import build_session


def load(args: argparse.Namespace) -> None:
    pipeline = load_pipeline(args.pipeline)
    plans = plans_from_json(args.plan)
    spark = build_session(pipeline) if plans else None
    for plan in plans:
        results = run_batch(spark, pipeline, plan)
        print(json.dumps({"batch_id": plan.batch_id, "tables": [r.to_dict() for r in results]}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="load.py")
    parser.add_argument("--pipeline", required=True, help="pipeline YAML file")
    parser.add_argument("--plan", required=True, help="batch plan JSON, or a list of them")
    return run_job(parser, load, argv)


if __name__ == "__main__":
    sys.exit(main())
