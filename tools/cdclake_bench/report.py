"""The benchmark's figures and targets, and what it prints: the table of figures, and
where a recorded batch's time went (from the load job's table results and CPU parts)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

from cdclake_bench.cpu import render_parts

# Steps in the order they run, and the figures each one produces.
STEP_FIGURES = {
    "throughput": ("throughput_eps", "cpu_s_per_m"),
    "throughput_merge": ("throughput_merge_eps", "peer_merge_ratio", "merge_cpu_s_per_m"),
    "throughput_merge_big": ("throughput_merge_big_eps", "peer_merge_big_ratio"),
    "throughput_history": ("throughput_history_eps", "history_ratio"),
    "peers": ("peer_ratio", "peer_one_call_ratio", "naive_ratio"),
    "throughput_toast": ("toast_ratio",),
    "throughput_flat": ("flat_ratio",),
    "throughput_avro": ("avro_ratio",),
    "throughput_kafka": ("throughput_kafka_eps",),
    "throughput_connect": ("connect_first_ratio", "connect_merge_ratio"),
    "fixed_overhead": ("fixed_overhead_s", "fixed_connect_s", "fixed_connect_cpu_s"),
    "merge_scaling": ("merge_scaling_ratio",),
    "deletes_v3": ("v3_write_ratio", "v3_read_ratio"),
    "memory": ("memory_ratio", "snapshot_memory_ratio"),
    "capture": ("capture_ratio",),
    "freshness": (
        "freshness_cron_p95_s", "freshness_watch_p95_s", "freshness_connect_p95_s",
        "freshness_cron_p50_s", "freshness_watch_p50_s", "freshness_connect_p50_s",
        "freshness_cron_max_s", "freshness_watch_max_s", "freshness_connect_max_s",
        "freshness_cron_lag_growth", "freshness_watch_lag_growth",
        "freshness_connect_lag_growth",
    ),
}  # fmt: skip
STEPS = tuple(STEP_FIGURES)

TARGETS = {
    "throughput_eps": (">=", 100_000),
    "throughput_merge_eps": (">=", 150_000),
    "peer_one_call_ratio": (">=", 2),
    "peer_merge_ratio": (">=", 5),
    "peer_merge_big_ratio": (">=", 5),
    "merge_scaling_ratio": ("<=", 1.5),
    "fixed_overhead_s": ("<=", 15),
    "fixed_connect_s": ("<=", 1.5),
    "connect_first_ratio": (">=", 0.95),
    "connect_merge_ratio": (">=", 0.95),
    "peer_ratio": (">=", 10),
    "memory_ratio": ("<=", 1.5),
    "snapshot_memory_ratio": ("<=", 1.2),
    "capture_ratio": (">=", 3),
    "freshness_cron_p95_s": ("<=", 60),
    "freshness_watch_p95_s": ("<=", 60),
    "freshness_cron_lag_growth": ("<=", 1.5),
    "freshness_watch_lag_growth": ("<=", 1.5),
    "freshness_connect_p95_s": ("<=", 15),
    "freshness_connect_lag_growth": ("<=", 1.5),
}

# Figures without a target, shown for context.
EXTRA_FIGURES = (
    "throughput_merge_big_eps", "throughput_kafka_eps", "naive_ratio", "toast_ratio",
    "flat_ratio", "avro_ratio", "throughput_history_eps", "history_ratio",
    "cpu_s_per_m", "merge_cpu_s_per_m", "v3_write_ratio", "v3_read_ratio",
    "freshness_cron_p50_s", "freshness_watch_p50_s", "freshness_cron_max_s",
    "freshness_watch_max_s", "fixed_connect_cpu_s", "freshness_connect_p50_s",
    "freshness_connect_max_s",
)  # fmt: skip
FIGURES = (*TARGETS, *EXTRA_FIGURES)


def job_tables(stdout: str) -> list[dict]:
    """The table results of the load job: its stdout has one JSON line per batch among
    whatever else Spark and the job print."""
    lines = [x for x in stdout.splitlines() if x.startswith('{"batch_id"')]
    if not lines:
        raise RuntimeError(f"no batch result in the load job's output: {stdout[-2000:]!r}")
    return [t for line in lines for t in json.loads(line)["tables"]]


def committed_tables(stdout: str) -> int:
    """Tables the load job says it committed."""
    return sum(1 for t in job_tables(stdout) if t["status"] == "committed")


STAGES = ("state", "resolve", "write")


def stage_seconds(tables: list[dict], parallel_tables: int) -> dict:
    """Where a batch's time went, from its tables' `seconds`: the batch's read (with its
    raw scan, or the resolve of the tables resolved range by range), then each table
    stage summed over the tables (they overlap when tables load `parallel_tables` at a
    time)."""
    out = {"read_s": max((t["seconds"].get("read", 0.0) for t in tables), default=0.0)}
    for stage in STAGES:
        out[f"{stage}_s"] = round(sum(t["seconds"].get(stage, 0.0) for t in tables), 3)
    out["tables"] = len(tables)
    out["parallel_tables"] = parallel_tables
    return out


def render_stages(details: dict) -> str:
    """A line per step that timed its batch's stages (the report's 'where the time goes')."""
    lines = []
    steps = [
        (step, details.get(step, {}).get("stages"))
        for step in ("throughput", "throughput_merge", "fixed_overhead")
    ]
    cpu = {s: details.get(s, {}).get("cpu_s") for s in ("throughput", "throughput_merge")}
    cores = len(os.sched_getaffinity(0))  # the batches ran on this machine
    for step, stages in steps:
        if not stages:
            continue
        per_table = ", ".join(f"{s} {stages[f'{s}_s']:,.1f}s" for s in STAGES)
        lines.append(
            f"{step}: read {stages['read_s']:,.1f}s (with the raw scan, or the resolve "
            f"range by range); summed over "
            f"{stages['tables']} tables ({stages['parallel_tables']} at a time): {per_table}"
        )
        if cpu.get(step):
            lines.append(f"  CPU: {render_parts(cpu[step], cores)}")
    return "\n".join(["", "where the time goes:", *lines]) if lines else ""


def render_table(figures: dict[str, float], sizes=None) -> str:
    """The figures against their targets, then the others (and the `Sizes` used)."""
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
    for name in EXTRA_FIGURES:
        value = figures.get(name)
        shown = "not measured" if value is None else f"{value:14,.2f}"
        lines.append(f"{name:24} {shown:>14}")
    if sizes is not None:
        lines += [
            "",
            "sizes: " + ", ".join(f"{k}={_size_text(v)}" for k, v in asdict(sizes).items()),
        ]
    return "\n".join(lines)


def _size_text(value: int | tuple[int, ...]) -> str:
    return ",".join(f"{v:_}" for v in value) if isinstance(value, tuple) else f"{value:_}"
