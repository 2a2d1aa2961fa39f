"""spark-submit entry point: Iceberg maintenance of every table of a pipeline.

spark-submit jobs/maintain.py --pipeline include/pipelines/demo.yaml --run-id <id>
"""

import argparse
import json
import sys

from cdclake.iceberg.maintenance import run_maintenance
from cdclake.lifecycle import run_job
from cdclake.pipeline_file import load_pipeline
from cdclake.spark import build_session


def maintain(args: argparse.Namespace) -> None:
    pipeline = load_pipeline(args.pipeline)
    summary = run_maintenance(pipeline, build_session(pipeline), run_id=args.run_id)
    print(json.dumps(summary))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="maintain.py")
    parser.add_argument("--pipeline", required=True, help="pipeline YAML file")
    parser.add_argument("--run-id", required=True, help="stored with the figures per table")
    return run_job(parser, maintain, argv)


if __name__ == "__main__":
    sys.exit(main())
