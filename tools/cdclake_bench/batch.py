"""One batch in a process of its own (`python -m cdclake_bench.batch`): its driver JVM
starts with the Java options a load of that many records gets (`jvm.driver_java_options`), and
the parent can sample the peak memory of its JVM and Python workers from the outside.

The events are either a recording (`--recording`) or generated inside the executors (a
10M-event batch is ~40 GB of records, too big to record): the same generator and the
same decode path as the recorded file. It prints one JSON line: the wall of the load
(decode, resolve, MERGE, commit; not the JVM's start), its CPU seconds by part of the
process tree (`cdclake_bench.cpu`) and each table's result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from cdclake.job import run_batch
from cdclake.offsets import BatchPlan, OffsetRange
from cdclake.pipeline_file import load_pipeline
from cdclake.placement import MEASURED, Placement
from cdclake.spark import REMOTE_ENV, build_session, connect_session

from cdclake_bench.cpu import cpu_parts, cpu_snapshot
from cdclake_bench.events import Workload
from cdclake_bench.sources import file_reader, generated_reader, recorded_ranges


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cdclake_bench.batch")
    p.add_argument("--pipeline", required=True)
    p.add_argument("--recording", type=Path, help="a recorded file's directory")
    p.add_argument("--events", type=int, help="events to generate")
    p.add_argument("--keys", type=int)
    p.add_argument("--tables", type=int, default=3)
    p.add_argument("--batch-id", default="bench-batch")
    # where the changes are resolved: a recording, `driver` or by range (`auto`)
    p.add_argument("--placement", choices=[m.value for m in Placement], default="auto")
    p.add_argument("--driver-read-records", type=int, default=MEASURED.driver_read_records)
    args = p.parse_args(argv)
    pipeline = load_pipeline(args.pipeline)
    if args.recording is not None:
        ranges = tuple(recorded_ranges(args.recording))
        read = file_reader(args.recording)
    elif args.events is not None and args.keys is not None:
        prefix = pipeline.topic_prefix
        workload = Workload.standard(args.events, args.keys, prefix, tables=args.tables)
        ranges = tuple(OffsetRange(t, part, 0, n) for t, part, n in workload.slices())
        read = generated_reader(workload)
    else:
        p.error("give --recording, or --events and --keys")
    records = sum(r.size for r in ranges)
    remote = os.environ.get(REMOTE_ENV)  # a Spark Connect server's, else a driver's own
    if remote:
        spark = connect_session(pipeline, remote, f"bench/{pipeline.name}")
    else:
        spark = build_session(pipeline, "local[2]", records=records)
    before = cpu_snapshot(os.getpid())
    started = time.perf_counter()
    results = run_batch(
        spark,
        pipeline,
        BatchPlan(pipeline.name, args.batch_id, ranges),
        read=read,
        placement=Placement(args.placement),
        tuning=replace(MEASURED, driver_read_records=args.driver_read_records),
    )
    wall = time.perf_counter() - started
    cpu = cpu_parts(before, cpu_snapshot(os.getpid()))
    print(json.dumps({"wall_s": wall, "tables": len(results), "cpu_s": cpu,
                      "results": [r.to_dict() for r in results]}))  # fmt: skip
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
