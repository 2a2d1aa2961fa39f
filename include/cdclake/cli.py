"""Command line: `python -m cdclake ...`."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from cdclake.exceptions import CdclakeError

log = logging.getLogger("cdclake")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cdclake", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    local = sub.add_parser("local", help="the local default stack")
    local_sub = local.add_subparsers(dest="action", required=True)
    local_sub.add_parser("up", help="start (idempotent) and print the endpoints")
    local_sub.add_parser("down", help="stop exactly the processes `up` started")
    st = local_sub.add_parser("status", help="endpoints and process state")
    st.add_argument("--json", action="store_true")
    local_sub.add_parser("env", help='shell exports for this stack (eval "$(...)")')
    local_sub.add_parser("wait", help="wait until the capture has sent every committed change")

    run = sub.add_parser("run", help="run one micro-batch of a pipeline")
    run.add_argument("--pipeline", required=True, help="pipeline YAML file")
    run.add_argument("--batch-id", default=None)

    plan = sub.add_parser("plan", help="print the next batch plan as JSON (no Spark)")
    plan.add_argument("--pipeline", required=True)
    plan.add_argument("--batch-id", default=None)

    compare = sub.add_parser("compare", help="compare every lake table with its source table")
    compare.add_argument("--pipeline", required=True)
    compare.add_argument("--source-dsn", required=True)

    bench = sub.add_parser("bench", help="benchmark the load job on the local stack")
    bench.add_argument("--scale", type=float, default=1.0, help="1 = full size (hours)")
    bench.add_argument("--out", default=".cdclake/bench/bench.json", help="JSON result file")
    bench.add_argument("--work", default=".cdclake/bench/work", help="scratch directory")
    bench.add_argument("--only", nargs="*", help="steps to run (default: all)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return _dispatch(args)
    except CdclakeError as exc:
        print(f"cdclake: error: {exc}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "local":
        return _local(args)
    if args.command == "plan":
        from cdclake.config import load_pipeline
        from cdclake.planner import plan_pipeline

        plan = plan_pipeline(load_pipeline(args.pipeline), args.batch_id)
        print(plan.to_json())
        return 0
    if args.command == "run":
        from cdclake.config import load_pipeline
        from cdclake.runner import run_once

        results = run_once(load_pipeline(args.pipeline), args.batch_id)
        print(json.dumps(results, indent=2, sort_keys=True))
        return 0
    if args.command == "compare":
        from cdclake.compare import compare_pipeline, render_comparison
        from cdclake.config import load_pipeline

        results = compare_pipeline(load_pipeline(args.pipeline), args.source_dsn)
        print(render_comparison(results))
        return 0 if all(r.equal for r in results) else 1
    if args.command == "bench":
        from pathlib import Path

        from cdclake.bench.runner import run_bench

        run_bench(args.scale, Path(args.work), Path(args.out), args.only)
        return 0
    raise AssertionError(args.command)


def _local(args: argparse.Namespace) -> int:
    from cdclake.local.stack import LocalStack, StackSettings

    stack = LocalStack(StackSettings.from_env())
    if args.action == "up":
        print(json.dumps(stack.up(), indent=2))
    elif args.action == "down":
        print(json.dumps(stack.down(), indent=2))
    elif args.action == "status":
        status = stack.status()
        if args.json:
            print(json.dumps(status, indent=2))
        else:
            for name in ("postgres", "kafka", "capture"):
                part = status[name]
                state = f"running (pid {part['pid']})" if part["running"] else "stopped"
                print(f"{name:10} {state}")
            print(f"{'catalog':10} {status['catalog']['uri']}  {status['catalog']['warehouse']}")
            print(f"{'airflow':10} AIRFLOW_HOME={status['airflow']['home']}")
    elif args.action == "env":
        for k, v in stack.env().items():
            print(f"export {k}={v}")
    elif args.action == "wait":
        stack.wait_for_capture()
    return 0
