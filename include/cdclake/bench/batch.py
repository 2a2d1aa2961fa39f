"""One generated batch in a process of its own (`python -m cdclake.bench.batch`), so the
parent can sample the peak memory of its JVM and Python workers from the outside.

The events are generated inside the executors (a 10M-event batch is ~40 GB of records,
too big to record): the same generator and the same decode path as the recorded file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from cdclake.bench.events import Workload
from cdclake.bench.sources import generated_reader
from cdclake.config import load_pipeline
from cdclake.job import run_batch
from cdclake.offsets import BatchPlan, OffsetRange
from cdclake.spark import build_session


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cdclake.bench.batch")
    p.add_argument("--pipeline", required=True)
    p.add_argument("--events", type=int, required=True)
    p.add_argument("--keys", type=int, required=True)
    p.add_argument("--tables", type=int, default=3)
    args = p.parse_args(argv)
    pipeline = load_pipeline(args.pipeline)
    prefix = pipeline.topic_prefix
    workload = Workload.standard(args.events, args.keys, prefix, tables=args.tables)
    ranges = tuple(OffsetRange(t, part, 0, n) for t, part, n in workload.slices())
    spark = build_session(pipeline, "local[2]")
    started = time.perf_counter()
    results = run_batch(spark, pipeline, BatchPlan(pipeline.name, "bench-mem", ranges),
                        read=generated_reader(workload))  # fmt: skip
    wall = time.perf_counter() - started
    print(json.dumps({"wall_s": wall, "tables": len(results)}))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
