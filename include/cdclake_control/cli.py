"""Command line: `python -m cdclake ...`."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from typing import TYPE_CHECKING

from cdclake.exceptions import CdclakeError

if TYPE_CHECKING:
    import datetime as dt

log = logging.getLogger("cdclake")


def _seconds(text: str) -> float:
    """A number of seconds > 0 (argparse refuses anything else before a command runs)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return value


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

    _backfill_parser(sub)
    _snapshot_parser(sub)
    _dead_letters_parser(sub)

    maintain = sub.add_parser("maintain", help="Iceberg maintenance of a pipeline's tables")
    maintain.add_argument("--pipeline", required=True, help="pipeline YAML file")

    compare = sub.add_parser("compare", help="compare every lake table with its source table")
    compare.add_argument("--pipeline", required=True)
    compare.add_argument("--source-dsn", required=True)

    _bench_parser(sub)

    archive = sub.add_parser(
        "jvm-archive", help="build the Spark driver's class-data-sharing archive (faster starts)"
    )
    archive.add_argument("--force", action="store_true", help="rebuild it when it exists")

    status = sub.add_parser("status", help="freshness of every lake table (commit, lag, rows)")
    status.add_argument(
        "--pipeline",
        help="pipeline YAML file (default: every pipeline in "
        "include/pipelines/ or $CDCLAKE_PIPELINES_DIR)",
    )
    status.add_argument("--json", action="store_true")
    return p


def _backfill_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`cdclake backfill`'s arguments."""
    bf = sub.add_parser(
        "backfill",
        help="replay a range of offsets, or rebuild tables from Kafka",
        description="Modes: replay re-applies [start, end) without regressing newer rows; "
        "rebuild drops the tables and reloads them from the earliest offset.",
    )
    bf.add_argument("--pipeline", required=True)
    bf.add_argument(
        "--table",
        action="append",
        dest="tables",
        default=[],
        help="source (schema.table) or target name; repeat; default all",
    )
    bf.add_argument("--mode", choices=["replay", "rebuild"], default="replay")
    bf.add_argument(
        "--start", choices=["earliest", "committed", "offsets", "timestamp"], default="earliest"
    )
    bf.add_argument("--start-offsets", help='JSON: {"<partition>": <offset>} or per table')
    bf.add_argument("--start-timestamp", help="ISO 8601 (UTC if no offset) or epoch ms")
    bf.add_argument("--end", choices=["latest", "offsets", "timestamp"], default="latest")
    bf.add_argument("--end-offsets")
    bf.add_argument("--end-timestamp")
    bf.add_argument(
        "--accept-retention-gap",
        action="store_true",
        help="rebuild although retention deleted the first records of a topic",
    )
    bf.add_argument("--dry-run", action="store_true", help="print the plans, load nothing")
    bf.add_argument("--id", dest="backfill_id", default=None, help="backfill id (default new)")


def _snapshot_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`cdclake snapshot`'s arguments."""
    sn = sub.add_parser(
        "snapshot",
        help="send a Debezium snapshot signal and follow it to the end",
        description="Validated against the pipeline and the source database before anything "
        "is written; the source DSN comes from --source-dsn, $CDCLAKE_SOURCE_DSN or source.dsn.",
    )
    sn.add_argument("--pipeline", required=True)
    sn.add_argument("--action", choices=["execute", "stop", "pause", "resume"], default="execute")
    sn.add_argument("--type", choices=["incremental", "blocking"], default="incremental")
    sn.add_argument("--table", action="append", dest="tables", default=[], help="repeat")
    sn.add_argument(
        "--filter",
        action="append",
        default=[],
        metavar="TABLE=CONDITION",
        help="additional condition of a table, e.g. inventory.orders='quantity > 1'",
    )
    sn.add_argument("--surrogate-key", default=None)
    sn.add_argument("--channel", choices=["source", "kafka"], default="source")
    sn.add_argument("--source-dsn", default=None)
    sn.add_argument(
        "--timeout", type=_seconds, default=3600, help="seconds to follow, > 0 (default 1h)"
    )
    sn.add_argument("--no-follow", action="store_true", help="send and return")


def _dead_letters_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dl = sub.add_parser(
        "dead-letters",
        help="list the records a pipeline set aside, or "
        "apply them again once what refused them is fixed",
    )
    dl.add_argument("action", choices=["list", "replay"])
    dl.add_argument("--pipeline", required=True, help="pipeline YAML file")
    dl.add_argument("--table", default=None, help="one table (its target or source name)")
    dl.add_argument(
        "--since",
        type=_instant,
        default=None,
        help="recorded at or after this ISO time (UTC) or epoch ms",
    )
    dl.add_argument("--all", action="store_true", help="list replayed ones too")
    dl.add_argument("--json", action="store_true", help="the listing as JSON")


def _instant(text: str) -> dt.datetime:
    from cdclake.exceptions import ConfigError
    from cdclake.redrive import parse_since

    try:
        return parse_since(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _dead_letters(args: argparse.Namespace) -> int:
    from cdclake.pipeline_file import load_pipeline
    from cdclake.redrive import describe, list_dead_letters, replay
    from cdclake.spark import build_session

    pipeline = load_pipeline(args.pipeline)
    spark = build_session(pipeline, pipeline.spark.master)
    if args.action == "list":
        rows = list_dead_letters(spark, pipeline, args.table, args.since, not args.all)
        print(
            json.dumps(rows, indent=2, default=str)
            if args.json
            else describe(pipeline.name, rows, not args.all)
        )
        return 0
    print(json.dumps(replay(spark, pipeline, args.table, args.since), indent=2, sort_keys=True))
    return 0


def _bench_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`cdclake bench`'s arguments."""
    bench = sub.add_parser("bench", help="benchmark the load job on the local stack")
    bench.add_argument("--scale", type=float, default=1.0, help="1 = full size (hours)")
    bench.add_argument("--out", default=".cdclake/bench/bench.json", help="JSON result file")
    bench.add_argument("--work", default=".cdclake/bench/work", help="scratch directory")
    bench.add_argument("--only", nargs="*", help="steps to run (default: all)")
    bench.add_argument(
        "--size",
        action="append",
        default=[],
        metavar="NAME=N[,N]",
        help="override one size of the scale, e.g. merge_rows=1000,100000",
    )
    bench.add_argument(
        "--baseline", metavar="REV", help="also run revision REV's benchmark; print both"
    )


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
        from cdclake_local.stack import command

        return command(args)
    if args.command == "plan":
        from cdclake.pipeline_file import load_pipeline

        from cdclake_control.planner import plan_pipeline

        pipeline = load_pipeline(args.pipeline)
        plan = plan_pipeline(pipeline, args.batch_id, pipeline.source.dsn)
        print(plan.to_json())
        return 0
    if args.command == "run":
        from cdclake.pipeline_file import load_pipeline

        from cdclake_control.runner import run_once

        results = run_once(load_pipeline(args.pipeline), args.batch_id)
        print(json.dumps(results, indent=2, sort_keys=True))
        return 0
    if args.command == "maintain":
        from cdclake.iceberg.maintenance import run_maintenance
        from cdclake.pipeline_file import load_pipeline

        print(json.dumps(run_maintenance(load_pipeline(args.pipeline)), indent=2, sort_keys=True))
        return 0
    if args.command == "backfill":
        return _backfill(args)
    if args.command == "snapshot":
        return _snapshot(args)
    if args.command == "dead-letters":
        return _dead_letters(args)
    if args.command == "compare":
        from cdclake.pipeline_file import load_pipeline

        from cdclake_control.compare import compare_pipeline, render_comparison

        compared = compare_pipeline(load_pipeline(args.pipeline), args.source_dsn)
        print(render_comparison(compared))
        return 0 if all(r.equal for r in compared) else 1
    if args.command == "bench":
        from cdclake_bench.baseline import command

        return command(args)
    if args.command == "jvm-archive":
        from cdclake_bench.jvm_archive import build_archive

        print(build_archive(force=args.force))
        return 0
    if args.command == "status":
        from cdclake_control.freshness import render_freshness, status_rows

        rows = status_rows(args.pipeline, int(time.time() * 1000))
        print(
            json.dumps([r.to_dict() for r in rows], indent=2)
            if args.json
            else render_freshness(rows)
        )
        return 0
    raise AssertionError(args.command)


def _backfill(args: argparse.Namespace) -> int:
    import uuid

    from cdclake.pipeline_file import load_pipeline

    from cdclake_control.backfill import (
        describe,
        parse_request,
        plan_pipeline_backfill,
        run_backfill,
    )

    pipeline = load_pipeline(args.pipeline)
    request = parse_request(
        pipeline,
        tables=args.tables,
        mode=args.mode,
        start=args.start,
        end=args.end,
        start_offsets=args.start_offsets,
        end_offsets=args.end_offsets,
        start_timestamp=args.start_timestamp,
        end_timestamp=args.end_timestamp,
        accept_retention_gap=args.accept_retention_gap,
    )
    backfill_id = args.backfill_id or f"backfill-{uuid.uuid4().hex[:12]}"
    plans = plan_pipeline_backfill(pipeline, request, backfill_id)
    print(describe(plans), file=sys.stderr)
    if args.dry_run or not plans:
        print(json.dumps([p.to_dict() for p in plans], indent=2))
        return 0
    from cdclake.spark import build_session

    results = run_backfill(build_session(pipeline, pipeline.spark.master), pipeline, plans)
    print(json.dumps(results, indent=2, sort_keys=True))
    return 0


def _snapshot(args: argparse.Namespace) -> int:
    import os

    from cdclake.pipeline_file import load_pipeline

    from cdclake_control.signals import SignalError, follow_snapshot, parse_request, submit

    pipeline = load_pipeline(args.pipeline)
    filters = {}
    for item in args.filter:
        table, sep, condition = item.partition("=")
        if not sep:
            raise SignalError(f"--filter {item!r} must be TABLE=CONDITION")
        filters[table.strip()] = condition
    request = parse_request(args.action, args.tables, args.type, filters, args.surrogate_key)
    dsn = args.source_dsn or os.environ.get("CDCLAKE_SOURCE_DSN") or pipeline.source.dsn
    if not dsn:
        raise SignalError("no source database: give --source-dsn or set CDCLAKE_SOURCE_DSN")
    sent = submit(pipeline, dsn, request, channel=args.channel, origin="cli")
    print(f"signal {sent['signal_id']} sent: {sent['action']} {sent['tables']}", file=sys.stderr)
    if not sent["follow"] or args.no_follow:
        print(json.dumps(sent, indent=2))
        return 0
    start = {int(p): o for p, o in sent["notification_offsets"].items()}
    progress = follow_snapshot(
        pipeline.kafka,
        pipeline.notification_topic,
        sent["signal_id"],
        args.timeout,
        start,
        sent["blocking"],
    )
    print(json.dumps(progress.to_dict(), indent=2))
    return 0
