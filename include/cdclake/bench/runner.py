"""`python -m cdclake bench`: every figure of the benchmark, measured in one run.

Scale 1 is the full benchmark (1M events, a 10M-row table, 10M-event batch); `--scale`
shrinks every count by the same factor (the test suite runs it at 0.001). Figures that
compare two measurements are always taken side by side in the same run.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from cdclake.bench.events import Workload, generate_slice
from cdclake.bench.pipeline import bench_pipeline
from cdclake.bench.sources import file_reader, record_workload, recorded_ranges
from cdclake.job import run_batch
from cdclake.local.stack import LocalStack, StackSettings
from cdclake.offsets import BatchPlan, OffsetRange
from cdclake.spark import spark_conf

LOAD_JOB = Path(__file__).resolve().parents[3] / "jobs" / "load.py"
STEPS = ("throughput", "peers", "throughput_kafka", "fixed_overhead", "merge_scaling",
         "memory", "capture")  # fmt: skip

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

    # ---- the same, from Kafka (tansu) --------------------------------------------------
    def throughput_kafka(self) -> None:
        events = self.n(100_000)
        workload = Workload.standard(events, self.n(25_000, 4), prefix=f"benchk{_tag()}")
        self.say(f"producing {events:,} events to tansu (one record per request)")
        ranges = produce_workload(self.stack.broker.bootstrap, workload)
        pipeline = bench_pipeline(self.work, self.stack.s, workload, "kafka")
        spark = self.session(pipeline)
        started = time.perf_counter()
        run_batch(spark, pipeline, BatchPlan(pipeline.name, "bench-kafka", tuple(ranges)))
        wall = time.perf_counter() - started
        self.figures["throughput_kafka_eps"] = events / wall
        self.details["throughput_kafka"] = {"events": events, "wall_s": wall}
        self.say(f"throughput from tansu: {events / wall:,.0f} events/s ({wall:.1f}s)")

    # ---- fixed overhead: spark-submit of jobs/load.py ----------------------------------
    def fixed_overhead(self) -> None:
        workload = Workload.standard(100, 50, prefix=f"benchf{_tag()}", tables=10, partitions=1)
        ranges = produce_workload(self.stack.broker.bootstrap, workload)
        pipeline = bench_pipeline(self.work, self.stack.s, workload, "fixed")
        plan = BatchPlan(pipeline.name, "bench-fixed", tuple(ranges))
        cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]"]
        for k, v in spark_conf(pipeline).items():
            cmd += ["--conf", f"{k}={v}"]
        cmd += [
            str(LOAD_JOB),
            "--pipeline",
            str(self.work / "fixed.yaml"),
            "--plan",
            plan.to_json(),
        ]
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        self.say("spark-submit jobs/load.py: 100 events over 10 tables")
        started = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"spark-submit failed: {done.stderr[-2000:]}")
        line = next(x for x in done.stdout.splitlines() if x.startswith('{"batch_id"'))
        out = json.loads(line)
        committed = sum(1 for t in out["tables"] if t["status"] == "committed")
        self.figures["fixed_overhead_s"] = wall
        self.details["fixed_overhead"] = {"wall_s": wall, "tables_committed": committed}
        self.say(f"fixed overhead: {wall:.1f}s, {committed} tables committed")

    # ---- peers on the recorded events ---------------------------------------------------
    def peers(self) -> None:
        from cdclake.bench.peers import naive_merge, peer_upsert
        from cdclake.catalog import load_catalog

        pipeline = self.details["file_pipeline"]
        workload = self.details["file_workload"]
        ours = self.figures["throughput_eps"]
        rec = self.work / "recording"
        ranges = recorded_ranges(rec)
        self.say("pydbzengine-style pyiceberg upsert on the same events")
        wall = peer_upsert(load_catalog(pipeline.catalog), f"peer_{_tag()}", rec, ranges)
        peer = workload.events / wall
        self.say("naive Spark MERGE on the same events")
        naive_wall = naive_merge(self.session(pipeline), pipeline.catalog.name,
                                 f"naive_{_tag()}", rec, ranges)  # fmt: skip
        naive = workload.events / naive_wall
        self.figures["peer_ratio"] = ours / peer
        self.figures["naive_ratio"] = ours / naive
        self.details["peers"] = {"pyiceberg_upsert_eps": peer, "naive_merge_eps": naive,
                                 "ours_eps": ours}  # fmt: skip
        self.say(f"pyiceberg upsert {peer:,.0f} events/s; naive MERGE {naive:,.0f} events/s")

    # ---- MERGE cost against table size --------------------------------------------------
    def merge_scaling(self) -> None:
        batch = self.n(10_000)
        walls = {}
        for rows in (self.n(100_000, 100), self.n(10_000_000, 1000)):
            walls[rows] = self._merge_into(rows, batch)
        small, big = sorted(walls)
        self.figures["merge_scaling_ratio"] = walls[big] / walls[small]
        self.details["merge_scaling"] = {
            "batch": batch,
            **{f"rows_{r}_s": w for r, w in walls.items()},
        }

    def _merge_into(self, rows: int, batch: int) -> float:
        from cdclake.bench.sources import generated_reader

        tag = _tag()
        seed = Workload(10, 10, Workload.standard(1, 1, f"benchm{tag}", tables=1).streams, 1)
        pipeline = bench_pipeline(self.work, self.stack.s, seed, f"merge{rows}")
        spark = self.session(pipeline)
        ranges = tuple(OffsetRange(t, p, 0, n) for t, p, n in seed.slices())
        run_batch(spark, pipeline, BatchPlan(pipeline.name, "seed", ranges),
                  read=generated_reader(seed))  # fmt: skip
        table = pipeline.qualified_target(pipeline.tables[0])
        self.say(f"filling {table} with {rows:,} rows")
        spark.sql(f"INSERT INTO {table} {fill_select(spark, table, rows)}")
        change = Workload(batch, rows, seed.streams, 1)
        ranges = tuple(OffsetRange(t, p, 10, 10 + n) for t, p, n in change.slices())
        started = time.perf_counter()
        run_batch(spark, pipeline, BatchPlan(pipeline.name, "change", ranges),
                  read=generated_reader(change))  # fmt: skip
        wall = time.perf_counter() - started
        self.say(f"{batch:,} changes into {rows:,} rows: {wall:.1f}s")
        spark.sql(f"DROP TABLE {table} PURGE")
        return wall

    # ---- peak memory against batch size --------------------------------------------------
    def memory(self) -> None:
        peaks = {}
        for events in (self.n(1_000_000), self.n(10_000_000)):
            workload = Workload.standard(events, self.n(250_000, 4), prefix=f"benchg{_tag()}")
            bench_pipeline(self.work, self.stack.s, workload, "memory")
            cmd = [sys.executable, "-m", "cdclake.bench.batch", "--pipeline",
                   str(self.work / "memory.yaml"), "--events", str(events),
                   "--keys", str(self.n(250_000, 4))]  # fmt: skip
            self.say(f"generated batch of {events:,} events in its own process")
            peaks[events] = peak_rss(cmd)
            self.say(f"peak RSS {peaks[events] / 2**20:,.0f} MiB")
        small, big = sorted(peaks)
        self.figures["memory_ratio"] = peaks[big] / peaks[small]
        self.details["memory"] = {f"events_{e}_peak_mib": p / 2**20 for e, p in peaks.items()}

    # ---- the real connector's capture rate -------------------------------------------------
    def capture(self) -> None:
        import psycopg

        rows = self.n(20_000, 200)
        self.stack.wait_for_capture()
        with psycopg.connect(self.stack.source_dsn, autocommit=True) as conn:
            conn.execute(
                "create table if not exists inventory.bench_capture (id bigint "
                "primary key, body text, amount numeric(14,4), at timestamptz)"
            )
            conn.execute("truncate inventory.bench_capture")
        self.stack.wait_for_capture()
        self.say(f"capturing {rows:,} inserted rows with Debezium")
        started = time.perf_counter()
        with psycopg.connect(self.stack.source_dsn, autocommit=True) as conn:
            conn.execute(
                "insert into inventory.bench_capture select g, repeat(md5(g::text), 30), "
                "g / 7.0, now() from generate_series(1, %s) g",
                (rows,),
            )
        self.stack.wait_for_capture(timeout=3600)
        wall = time.perf_counter() - started
        rate = rows / wall
        if "throughput_eps" in self.figures:
            self.figures["capture_ratio"] = self.figures["throughput_eps"] / rate
        self.details["capture"] = {"rows": rows, "wall_s": wall, "capture_eps": rate}
        self.say(f"Debezium capture: {rate:,.0f} events/s")


def _tag() -> str:
    return uuid.uuid4().hex[:6]


def produce_workload(bootstrap: str, workload: Workload) -> list[OffsetRange]:
    """Produce the workload to Kafka, one record per request (see DESIGN: tansu)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(s.topic, workload.partitions, 1) for s in workload.streams]
    )
    for f in futures.values():
        f.result()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                         "batch.num.messages": 1, "acks": "all"})  # fmt: skip
    ranges = []
    for topic, partition, count in workload.slices():
        for cols in generate_slice(workload, topic, partition, 0, count, set()):
            for key, value, ts in zip(cols["key"], cols["value"], cols["timestamp"], strict=True):
                while True:
                    try:
                        producer.produce(topic, value, key, partition=partition, timestamp=ts)
                        break
                    except BufferError:
                        producer.poll(0.1)
        producer.flush(600)
        ranges.append(OffsetRange(topic, partition, 0, count))
    return ranges


_FILL_BY_TYPE = {
    "bigint": "id", "int": "cast(id % 1000 as int)", "boolean": "true",
    "timestamp": "current_timestamp()", "timestamp_ntz": "localtimestamp()",
    "date": "current_date()",
}  # fmt: skip


def fill_select(spark, table: str, rows: int) -> str:
    """SELECT of `rows` rows for every column of `table`, keys 1..rows, text of the size
    the templates have."""
    exprs = []
    for f in spark.table(table).schema.fields:
        kind = f.dataType.simpleString()
        if f.name == "id":
            expr = "id"
        elif f.name == "_cdc_lsn":
            expr = "1"
        elif f.name == "_cdc_op":
            expr = "'r'"
        elif kind == "string":
            expr = (
                "concat_ws(' ', sha2(cast(id as string), 256), sha2(cast(id + 1 as string), 256))"
            )
        elif kind.startswith("decimal"):
            expr = f"cast(id % 1000 as {kind})"
        else:
            expr = _FILL_BY_TYPE.get(kind, f"cast(null as {kind})")
        exprs.append(f"cast({expr} as {kind}) as `{f.name}`")
    return f"SELECT {', '.join(exprs)} FROM range(1, {rows + 1})"


def peak_rss(cmd: list[str]) -> int:
    """Run `cmd`; the peak of the summed RSS of it and all its descendants (JVM, Python
    workers), sampled every 0.2 s."""
    import psutil

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    top = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            procs = [top, *top.children(recursive=True)]
            total = 0
            for p in procs:
                try:
                    total += p.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            peak = max(peak, total)
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.2)
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} failed: {err[-2000:]}")
    return peak


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
    for step in STEPS:
        if only and step not in only:
            continue
        try:
            getattr(bench, step)()
        except Exception as exc:  # a failed figure is reported, the others still run
            log.exception("bench step %s failed", step)
            bench.details.setdefault("errors", {})[step] = f"{type(exc).__name__}: {exc}"
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
