"""spark-submit entry point: Iceberg maintenance of every table of a pipeline.

spark-submit jobs/maintain.py --pipeline include/pipelines/demo.yaml --run-id <id>
"""

import argparse
import json
import logging
import sys

from cdclake.config import load_pipeline
from cdclake.exceptions import CdclakeError
from cdclake.lifecycle import exit_with_parent
from cdclake.maintenance import run_maintenance
from cdclake.spark import build_session


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="maintain.py")
    parser.add_argument("--pipeline", required=True, help="pipeline YAML file")
    parser.add_argument("--run-id", required=True, help="stored with the figures per table")
    args = parser.parse_args(argv)
    exit_with_parent()  # a killed spark-submit (task timeout, manual kill) takes us along
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        pipeline = load_pipeline(args.pipeline)
        summary = run_maintenance(pipeline, build_session(pipeline), run_id=args.run_id)
    except CdclakeError as exc:
        print(f"cdclake: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
