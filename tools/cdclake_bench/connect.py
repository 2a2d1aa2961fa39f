"""The fixed cost of a batch on a warm Spark Connect server, beside spark-submit's
(`fixed_overhead`): the same plan loaded by a client process as the Airflow task runs it
(`cdclake_airflow.tasks.load_on_connect`), its wall and CPU seconds, and the server's CPU
seconds for the batch. The server is warmed by a first batch of the same workload into
tables of their own."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cdclake.offsets import BatchPlan
from cdclake_local.spark_connect import LocalSparkConnect

from cdclake_bench.pipeline import bench_pipeline

# a client process: load the plan (argv[2]) of the pipeline file argv[1] on the server
CLIENT = """
import json, sys
from cdclake.job import run_batch
from cdclake.offsets import plans_from_json
from cdclake.pipeline_file import load_pipeline
from cdclake.spark import REMOTE_ENV, connect_session
import os

pipeline = load_pipeline(sys.argv[1])
spark = connect_session(pipeline, os.environ[REMOTE_ENV], "bench/" + pipeline.name)
results = run_batch(spark, pipeline, plans_from_json(sys.argv[2])[0])
print(json.dumps({"tables": [r.to_dict() for r in results]}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` and its waited-for children (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def server_java_pid(server: LocalSparkConnect) -> int | None:
    """The server's JVM (spark-submit's child) or spark-submit itself."""
    pid = server.pid()
    if pid is None:
        return None
    children = Path(f"/proc/{pid}/task/{pid}/children")
    found = children.read_text().split() if children.exists() else []
    return int(found[0]) if found else pid


def connect_load(server: LocalSparkConnect, path: Path, plan: BatchPlan) -> dict:
    """Load `plan` of the pipeline file `path` from a client process: its wall and CPU
    seconds, the server JVM's CPU seconds meanwhile, and the job's answer."""
    env = {**os.environ, "CDCLAKE_SPARK_REMOTE": server.remote}
    java = server_java_pid(server)
    server_before = process_cpu_s(java) if java else 0.0
    before = _children_cpu_s()
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CLIENT, str(path), plan.to_json()],
                          env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    wall = time.perf_counter() - started
    cpu = _children_cpu_s() - before
    if done.returncode != 0:
        raise RuntimeError(f"the Spark Connect client failed: {done.stderr[-2000:]}")
    server_cpu = (process_cpu_s(java) - server_before) if java else None
    return {"wall_s": round(wall, 2), "client_cpu_s": round(cpu, 2),
            "server_cpu_s": None if server_cpu is None else round(server_cpu, 2),
            "answer": json.loads(done.stdout.strip().splitlines()[-1])}  # fmt: skip


def _children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def connect_fixed(work: Path, settings, workload, plan: BatchPlan) -> dict:
    """On a server of its own, warmed by the whole `plan` into tables of their own: the
    first half of each range into new tables (`first`), then the second half (`steady`:
    a scheduled batch of a pipeline already loaded)."""
    from cdclake.offsets import OffsetRange

    server = LocalSparkConnect(work / "spark-connect", free_port())
    started = time.perf_counter()
    server.start()
    found: dict = {"server_start_s": round(time.perf_counter() - started, 1)}
    try:
        warm = bench_pipeline(work, settings, workload, "fixed_warm")
        connect_load(server, work / "fixed_warm.yaml", BatchPlan(warm.name, "warm", plan.ranges))
        on = bench_pipeline(work, settings, workload, "fixed_connect")
        halves = [(r, (r.start + r.end) // 2) for r in plan.ranges]
        first = [OffsetRange(r.topic, r.partition, r.start, mid) for r, mid in halves]
        rest = [OffsetRange(r.topic, r.partition, mid, r.end) for r, mid in halves]
        for label, ranges in (("first", first), ("steady", rest)):
            batch = BatchPlan(on.name, f"bench-connect-{label}", tuple(ranges))
            found[label] = connect_load(server, work / "fixed_connect.yaml", batch)
            found[label].pop("answer")
    finally:
        server.stop()
    return found


class ConnectSteps:
    """Steps of `cdclake_bench.runner.Bench` (which gives `sizes`, `work`, `stack`,
    `figures`, `details`, `say`, `_recorded_batch` and `_merge_recording`)."""

    def throughput_connect(self) -> None:  # type: ignore[misc]
        """The throughput step's first load and `throughput_merge`'s MERGE, each loaded
        side by side by a process of its own (its driver JVM started for the batch) and
        by a client of a Spark Connect server, warm as a long-lived one is (its first
        batch, the MERGE's first half into tables of its own, is not measured): the walls
        of the load alone, and their ratios (spark-submit's wall over the server's)."""
        self_: Any = self
        rec = self_.work / "recording"
        workload, first, second = self_._merge_recording()
        server = LocalSparkConnect(self_.work / "spark-connect-throughput", free_port())
        server.start()
        found: dict = {}
        try:
            warm = bench_pipeline(self_.work, self_.stack.s, workload, "tc_warm")
            self_._recorded_batch(warm, first, "bench-tc-warm", server.remote)
            for engine, remote in (("submit", ""), ("connect", server.remote)):
                load = bench_pipeline(self_.work, self_.stack.s, workload, f"tc_{engine}")
                found[f"{engine}_first"] = self_._recorded_batch(
                    load, rec, f"bench-tc-{engine}", remote
                )
                merge = bench_pipeline(self_.work, self_.stack.s, workload, f"tm_{engine}")
                self_._recorded_batch(merge, first, f"bench-tm-{engine}-first", remote)
                found[f"{engine}_merge"] = self_._recorded_batch(
                    merge, second, f"bench-tm-{engine}", remote
                )
        finally:
            server.stop()
        for kind in ("first", "merge"):
            ratio = found[f"submit_{kind}"]["wall_s"] / found[f"connect_{kind}"]["wall_s"]
            self_.figures[f"connect_{kind}_ratio"] = ratio
            self_.say(
                f"{kind} batch on the Spark Connect server: "
                f"{found[f'connect_{kind}']['wall_s']:.1f}s against "
                f"{found[f'submit_{kind}']['wall_s']:.1f}s ({ratio:.2f}x)"
            )
        self_.details["throughput_connect"] = found
