"""spark-submit entry point: list or replay a pipeline's dead letters (the
`cdclake_dead_letters` form; `cdclake dead-letters` runs the same in-process). The answer
in words comes first, then the same as JSON.

spark-submit jobs/dead_letters.py --pipeline include/pipelines/demo.yaml --action replay \
    [--table inventory.orders] [--since 2026-11-27T08:00]

An empty `--table` or `--since` (a form's field left empty) means every table, any time.
"""

import argparse
import json
import sys

from cdclake.lifecycle import run_job
from cdclake.pipeline_file import load_pipeline
from cdclake.redrive import describe, list_dead_letters, parse_since, replay
from cdclake.spark import build_session


def run(args: argparse.Namespace) -> None:
    pipeline = load_pipeline(args.pipeline)
    spark = build_session(pipeline)
    table, since = args.table or None, parse_since(args.since) if args.since else None
    if args.action == "list":
        rows = list_dead_letters(spark, pipeline, table, since)
        print(describe(pipeline.name, rows))
        print(json.dumps(rows, default=str))
    else:
        report = replay(spark, pipeline, table, since)
        print(
            f"{report['replayed']} of {report['pending']} pending dead letter(s) for "
            f"{pipeline.name} replayed"
        )
        print(json.dumps(report))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dead_letters.py")
    parser.add_argument("--pipeline", required=True, help="pipeline YAML file")
    parser.add_argument("--action", choices=["list", "replay"], required=True)
    parser.add_argument("--table", default="")
    parser.add_argument("--since", default="")
    return run_job(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
