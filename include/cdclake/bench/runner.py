"""`python -m cdclake bench`: every figure of the benchmark, measured in one run.

Scale 1 is the full benchmark (1M events, a 10M-row table, 10M-event batch); `--scale`
shrinks every count by the same factor (the test suite runs it at 0.001). Figures that
compare two measurements are always taken side by side in the same run.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from cdclake.bench.events import Workload
from cdclake.bench.pipeline import bench_pipeline
from cdclake.bench.sources import file_reader, record_workload
from cdclake.job import run_batch
from cdclake.local.stack import LocalStack, StackSettings
from cdclake.offsets import BatchPlan

log = logging.getLogger(__name__)

TARGETS = {
    "throughput_eps": (">=", 100_000),
    "merge_scaling_ratio": ("<=", 2.0),
    "fixed_overhead_s": ("<=", 15),
    "peer_ratio": (">=", 10),
    "memory_ratio": ("<=", 1.5),
    "capture_ratio": (">=", 3),
}


@dataclass
class Bench:
    scale: float
    work: Path
    stack: LocalStack
    figures: dict[str, float] = field(default_factory=dict)
    details: dict[str, object] = field(default_factory=dict)
    spark: object = None

    def n(self, full: int, least: int = 10) -> int:
        return max(least, int(full * self.scale))

    def say(self, text: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {text}", flush=True)

    def session(self, pipeline):
        if self.spark is None:
            from cdclake.spark import build_session

            self.spark = build_session(pipeline, "local[2]")
        return self.spark

    # ---- throughput ------------------------------------------------------------------
    def throughput(self) -> None:
        events, keys = self.n(1_000_000), self.n(250_000, 4)
        workload = Workload.standard(events, keys)
        rec = self.work / "recording"
        shutil.rmtree(rec, ignore_errors=True)
        self.say(f"recording {events:,} events over {keys:,} keys in 3 tables")
        ranges = record_workload(workload, rec)
        size = sum(f.stat().st_size for f in rec.glob("*.parquet"))
        self.details["recording"] = {"events": events, "keys": keys, "bytes_on_disk": size}
        pipeline = bench_pipeline(self.work, self.stack.s, workload, "file")
        spark = self.session(pipeline)
        plan = BatchPlan(pipeline.name, "bench-file", tuple(ranges))
        self.say("loading the recording (decode, resolve, MERGE, commit)")
        started = time.perf_counter()
        results = run_batch(spark, pipeline, plan, read=file_reader(rec))
        wall = time.perf_counter() - started
        self.figures["throughput_eps"] = events / wall
        self.details["throughput"] = {
            "wall_s": wall,
            "upserts": sum(r.upserts for r in results),
            "deletes": sum(r.deletes for r in results),
            "namespace": pipeline.namespace,
        }
        self.details["file_pipeline"] = pipeline
        self.details["file_workload"] = workload
        self.say(f"throughput from file: {events / wall:,.0f} events/s ({wall:.1f}s)")


def render_table(figures: dict[str, float]) -> str:
    lines = [f"{'figure':24} {'measured':>14} {'target':>12}  met", "-" * 58]
    for name, (op, target) in TARGETS.items():
        value = figures.get(name)
        if value is None:
            lines.append(f"{name:24} {'not measured':>14} {op + ' ' + str(target):>12}  -")
            continue
        met = value >= target if op == ">=" else value <= target
        lines.append(
            f"{name:24} {value:14,.2f} {op + ' ' + str(target):>12}  {'yes' if met else 'NO'}"
        )
    for name, value in figures.items():
        if name not in TARGETS:
            lines.append(f"{name:24} {value:14,.2f} {'':>12}")
    return "\n".join(lines)


def run_bench(scale: float, work: Path, out: Path, only: list[str] | None = None) -> dict:
    stack = LocalStack(StackSettings.from_env())
    stack.up()
    bench = Bench(scale, work, stack)
    steps = ["throughput"]
    for step in steps:
        if only and step not in only:
            continue
        getattr(bench, step)()
    report = {
        "scale": scale,
        "figures": bench.figures,
        "targets": {k: {"op": op, "value": v} for k, (op, v) in TARGETS.items()},
        "details": {k: v for k, v in bench.details.items() if not k.startswith("file_")},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(render_table(bench.figures))
    return report
