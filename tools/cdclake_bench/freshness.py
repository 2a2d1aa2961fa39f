"""The `freshness` step: how old a change is when a reader of the lake can see it, with
the real scheduler (`airflow standalone`) running a pipeline's load DAG on a cron
schedule, then on its records (`watch:`).

For each mode a new source table gets `fresh_rate` changes a second for `fresh_seconds`
(upserts of random keys and some deletes, in transactions every 100 ms) while a reader
polls the table's Iceberg snapshot every second for its committed offsets, and Kafka for
its end offsets. A change is visible at the first poll whose committed offset is past
its record; its latency is that time minus its commit time in PostgreSQL (`source.ts_ms`
of its Debezium record). The lag in offsets is end minus committed at every poll; the
lag growth compares its mean over the last third of the writes with the middle third.
"""

from __future__ import annotations

import bisect
import itertools
import random
import shutil
import statistics
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from cdclake.config import PipelineConfig
from cdclake.iceberg.catalog import load_catalog
from cdclake_control.catalog import table_state
from cdclake_control.lag import source_time_ms
from cdclake_control.watermarks import fetch_watermarks
from cdclake_local.airflow_home import connections, kafka_connection, setup_airflow_home
from cdclake_local.airflow_server import AirflowServer, free_port
from cdclake_local.spark_connect import LocalSparkConnect

from cdclake_bench.pipeline import write_pipeline

ROOT = Path(__file__).resolve().parents[2]
WATCH_CONN = "cdclake_kafka_bench"
CONNECT_CONN = "cdclake_spark_connect_bench"
MODES = {
    "cron": {"schedule": "* * * * *"},  # Airflow's finest cron: every minute
    "watch": {"schedule": None, "watch": {"conn_id": WATCH_CONN}},
    # woken by records, loaded on a Spark Connect server instead of spark-submit
    "connect": {"schedule": None, "watch": {"conn_id": WATCH_CONN},
                "spark": {"connect_conn_id": CONNECT_CONN}},
}  # fmt: skip
TICK_S = 0.1  # one source transaction per tick
POLL_S = 1.0  # the lake reader's poll
CATCH_UP_S = 300  # after the writes, how long the last changes may take to be visible
DELETE_SHARE = 0.05


@dataclass(frozen=True)
class Poll:
    """What the reader saw at `at_ms`: committed and end offset per partition."""

    at_ms: int
    committed: dict[int, int]
    high: dict[int, int]

    @property
    def behind(self) -> int:
        return sum(max(0, h - self.committed.get(p, 0)) for p, h in self.high.items())


@dataclass
class Phase:
    mode: str
    table: str
    pipeline: PipelineConfig
    polls: list[Poll] = field(default_factory=list)
    written: dict = field(default_factory=dict)


def latencies_s(polls: list[Poll], records: list[tuple[int, int, int]]) -> tuple[list[float], int]:
    """Seconds from each record's source commit to the first poll that saw it committed,
    and how many records no poll saw. `records`: (partition, offset, source ts_ms);
    `polls` in time order (committed offsets only grow)."""
    out, unseen = [], 0
    for partition in sorted({r[0] for r in records}):
        committed = [poll.committed.get(partition, 0) for poll in polls]
        for _, offset, ts_ms in (r for r in records if r[0] == partition):
            i = bisect.bisect_right(committed, offset)
            if i == len(polls):
                unseen += 1
            else:
                out.append((polls[i].at_ms - ts_ms) / 1000)
    return out, unseen


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def lag_growth(polls: list[Poll], start_ms: int, end_ms: int) -> dict:
    """Mean offsets behind over the middle and the last third of the writes, and their
    ratio (1: the lag does not grow)."""
    third = (end_ms - start_ms) / 3

    def mean(lo: float, hi: float) -> float:
        inside = [p.behind for p in polls if lo <= p.at_ms < hi]
        return statistics.fmean(inside) if inside else 0.0

    middle, last = mean(start_ms + third, end_ms - third), mean(end_ms - third, end_ms)
    return {"middle": middle, "last": last, "growth": last / middle if middle else None}


def summarize(
    phase: Phase, records: list[tuple[int, int, int]], runs: list[dict], tasks: list[dict]
) -> dict:
    """The phase's figures: latency percentiles of the changes written in it, lag, and
    the median of each task's time running."""
    start_ms, end_ms = phase.written["start_ms"], phase.written["end_ms"]
    lat, unseen = latencies_s(phase.polls, [r for r in records if r[2] >= start_ms])
    series = [(round((p.at_ms - start_ms) / 1000), p.behind) for p in phase.polls[::10]]
    done = [r for r in runs if r.get("start_date") and r.get("end_date")]
    return {
        "records": len(lat) + unseen,
        "unseen": unseen,
        "p50_s": percentile(lat, 0.5) if lat else None,
        "p95_s": percentile(lat, 0.95) if lat else None,
        "max_s": max(lat) if lat else None,
        "lag": lag_growth(phase.polls, start_ms, end_ms),
        "lag_series": series,  # (seconds from the first write, offsets behind)
        "runs": len(runs),
        "run_states": sorted({r["state"] for r in runs}),
        **_run_times(done),
        "task_s_median": _task_times(tasks),
        **phase.written,
    }


def _run_times(runs: list[dict]) -> dict:
    """Where a run's time goes, medians: running (start to end), queued (queued to start),
    and idle between one run's end and the next one's start."""
    from datetime import datetime

    def at(run: dict, key: str) -> float:
        return datetime.fromisoformat(run[key]).timestamp() if run.get(key) else float("nan")

    def median(values) -> float | None:
        kept = [v for v in values if v == v]
        return round(statistics.median(kept), 1) if kept else None

    runs = sorted(runs, key=lambda r: at(r, "start_date"))
    return {
        "run_s_median": median(at(r, "end_date") - at(r, "start_date") for r in runs),
        "queued_s_median": median(at(r, "start_date") - at(r, "queued_at") for r in runs),
        "between_runs_s_median": median(
            at(b, "start_date") - at(a, "end_date") for a, b in itertools.pairwise(runs)
        ),
    }


def _task_times(tasks: list[dict]) -> dict[str, float]:
    """Each task's median time running, by task id."""
    found: dict[str, list[float]] = {}
    for task in tasks:
        if task.get("duration") is not None and task.get("state") == "success":
            found.setdefault(task["task_id"], []).append(task["duration"])
    return {name: round(statistics.median(times), 2) for name, times in sorted(found.items())}


# ---- the source writer ----------------------------------------------------------------
def write_changes(dsn: str, table: str, rate: int, seconds: float, keys: int) -> dict:
    """`rate` changes a second for `seconds` into `table`: every tick one transaction of
    upserts of distinct random keys and deletes of some of them. Returns what was done."""
    per_tick = max(1, round(rate * TICK_S))
    rng = random.Random(7)
    changes, ticks, behind_s = 0, 0, 0.0
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = time.monotonic()
        start_ms = int(time.time() * 1000)
        while (now := time.monotonic()) - start < seconds:
            due = start + ticks * TICK_S
            if now < due:
                time.sleep(due - now)
            behind_s = max(behind_s, now - due)
            ids = rng.sample(range(1, keys + 1), per_tick)
            cut = int(per_tick * DELETE_SHARE)
            with conn.transaction():
                upserted = conn.execute(
                    f"insert into {table} (id, n, note, at) select k, 1, md5(k::text), "
                    "clock_timestamp() from unnest(%s::int[]) k on conflict (id) do update "
                    f"set n = {table}.n + 1, at = excluded.at", (ids[cut:],),
                ).rowcount  # fmt: skip
                deleted = conn.execute(f"delete from {table} where id = any(%s)",
                                       (ids[:cut],)).rowcount  # fmt: skip
            changes += upserted + deleted
            ticks += 1
        wall = time.monotonic() - start
    return {"start_ms": start_ms, "end_ms": start_ms + int(wall * 1000), "changes": changes,
            "write_s": wall, "changes_per_s": changes / wall, "late_s": behind_s}  # fmt: skip


# ---- the lake reader --------------------------------------------------------------------
class Reader(threading.Thread):
    """Polls the table's committed offsets (its Iceberg snapshot) and Kafka's end offsets
    every second into `phase.polls`, until stopped."""

    def __init__(self, phase: Phase):
        from confluent_kafka import Consumer, TopicPartition

        super().__init__(daemon=True)
        self.phase, self.halt = phase, threading.Event()
        pipeline = phase.pipeline
        self.catalog = load_catalog(pipeline.catalog)
        self.topic = pipeline.topic_for(pipeline.tables[0])
        marks = fetch_watermarks(pipeline.kafka, [self.topic])
        self.partitions = [TopicPartition(t, p) for t, p in marks]
        self.consumer = Consumer({**pipeline.kafka.client_config(),
                                  "group.id": f"fresh-{uuid.uuid4()}"})  # fmt: skip

    def poll(self) -> Poll:
        pipeline = self.phase.pipeline
        state = table_state(self.catalog, pipeline, pipeline.tables[0])
        timeout = pipeline.kafka.timeouts.request_s
        high = {tp.partition: self.consumer.get_watermark_offsets(tp, timeout=timeout)[1]
                for tp in self.partitions}  # fmt: skip
        committed = {p: o for (t, p), o in state.offsets.items() if t == self.topic}
        return Poll(int(time.time() * 1000), committed, high)

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                started = time.monotonic()
                self.phase.polls.append(self.poll())
                self.halt.wait(max(0.0, POLL_S - (time.monotonic() - started)))
        finally:
            self.consumer.close()

    def caught_up(self) -> bool:
        last = self.phase.polls[-1] if self.phase.polls else None
        return last is not None and last.behind == 0


def topic_records(pipeline: PipelineConfig) -> list[tuple[int, int, int]]:
    """(partition, offset, source ts_ms) of every change record of the pipeline's one
    topic (tombstones have no source time and are left out)."""
    from confluent_kafka import Consumer, TopicPartition

    topic = pipeline.topic_for(pipeline.tables[0])
    marks = fetch_watermarks(pipeline.kafka, [topic])
    consumer = Consumer({**pipeline.kafka.client_config(), "group.id": f"fresh-{uuid.uuid4()}",
                         "enable.auto.commit": "false"})  # fmt: skip
    consumer.assign([TopicPartition(t, p, m.low) for (t, p), m in marks.items()])
    left = {p: m.high for (_, p), m in marks.items() if m.high > m.low}
    out = []
    deadline = time.monotonic() + 600
    while left and time.monotonic() < deadline:
        for msg in consumer.consume(10_000, timeout=5):
            if msg.error():
                continue
            ts = source_time_ms(msg.value())
            if ts is not None:
                out.append((msg.partition(), msg.offset(), ts))
            if msg.offset() + 1 >= left.get(msg.partition(), 0):
                left.pop(msg.partition(), None)
    consumer.close()
    if left:
        raise RuntimeError(f"{topic}: records of partitions {sorted(left)} not read in 600 s")
    return out


# ---- the step -----------------------------------------------------------------------------
def start_airflow(stack, work: Path, pipelines: Path, connect: dict) -> AirflowServer:
    """A new AIRFLOW_HOME under `work` with the stack's connections, the watch one and
    the Spark Connect server's (`connect`), and `airflow standalone` over the pipelines
    in `pipelines`."""
    home = work / "freshness-airflow"
    shutil.rmtree(home, ignore_errors=True)
    port = free_port()
    client = stack.broker.client_config()
    conns = connections(stack.s.pg_port, client, stack.s.source_db)
    conns[WATCH_CONN] = kafka_connection(client, f"cdclake-watch-bench-{uuid.uuid4().hex[:6]}")
    conns[CONNECT_CONN] = connect
    setup_airflow_home(ROOT, home, conns, port)
    env = {k: v for k, v in stack.env().items() if k != "AIRFLOW_HOME"}
    env["CDCLAKE_PIPELINES_DIR"] = str(pipelines)
    return AirflowServer(home, port, env, work / "freshness-airflow.log").start()


def new_phase(stack, pipelines: Path, mode: str, keys: int, name: str = "") -> Phase:
    """A source table of `keys` rows, captured, and its pipeline file (`fresh_<name>`,
    the mode's name unless given)."""
    name = name or mode
    table = f"inventory.fresh_{name}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, n bigint, note text, "
                     "at timestamptz)")  # fmt: skip
        conn.execute(f"insert into {table} select g, 0, md5(g::text), now() "
                     "from generate_series(1, %s) g", (keys,))  # fmt: skip
    stack.wait_for_capture(timeout=600)
    pipeline = write_pipeline(pipelines / f"fresh_{name}.yaml", stack.s, f"fresh_{name}",
                              stack.s.topic_prefix, [table], **MODES[mode])  # fmt: skip
    return Phase(mode, table, pipeline)


def wait(what: str, check, timeout: float, server: AirflowServer) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s\n{server.tail()}")
        time.sleep(2)


def pause_when_idle(server: AirflowServer, dag_id: str) -> None:
    """Switch the DAG off between runs (a run of a paused DAG is not carried on)."""
    deadline = time.monotonic() + CATCH_UP_S
    while time.monotonic() < deadline:
        if not any(r["state"] in ("queued", "running") for r in server.runs(dag_id)):
            server.pause(dag_id)
            if not any(r["state"] in ("queued", "running") for r in server.runs(dag_id)):
                return
            server.unpause(dag_id)  # a run began meanwhile: let it finish
        time.sleep(2)
    raise RuntimeError(f"{dag_id}: still running {CATCH_UP_S} s after the writes\n"
                       f"{server.tail()}")  # fmt: skip


def wait_listening(stack, server: AirflowServer, phase: Phase, dag_id: str, keys: int) -> float:
    """A record-woken DAG's trigger starts in the triggerer some seconds after the DAG is
    switched on, then waits for records newer than itself: a trickle of changes until
    the DAG's first run, so that the phase's changes find it listening. The seconds it
    took."""
    start = time.monotonic()

    def listening() -> bool:
        write_changes(stack.source_dsn, phase.table, 10, 1.0, keys)
        return bool(server.runs(dag_id))

    wait(f"{dag_id}'s first run", listening, CATCH_UP_S, server)
    return round(time.monotonic() - start, 1)


def run_phase(stack, server: AirflowServer, phase: Phase, rate: int, seconds: float,
              keys: int, say) -> dict:  # fmt: skip
    """Switch the phase's DAG on, write for `seconds` while the reader polls, wait for
    the last changes to be visible, switch it off: the phase's figures."""
    dag_id = f"cdclake__{phase.pipeline.name}"
    wait(f"{dag_id} parsed", lambda: server.dag(dag_id), 180, server)
    reader = Reader(phase)
    reader.start()
    server.unpause(dag_id)
    listening_s = (
        None if phase.mode == "cron" else wait_listening(stack, server, phase, dag_id, keys)
    )
    say(f"freshness, {phase.mode}: {rate:,} changes/s for {seconds:.0f} s into {phase.table}")
    phase.written = write_changes(stack.source_dsn, phase.table, rate, seconds, keys)
    stack.wait_for_capture(timeout=CATCH_UP_S)
    deadline = time.monotonic() + CATCH_UP_S
    while not reader.caught_up() and time.monotonic() < deadline:
        time.sleep(POLL_S)
    reader.halt.set()
    reader.join()
    pause_when_idle(server, dag_id)
    runs, tasks = server.runs(dag_id), server.task_instances(dag_id)
    found = {**summarize(phase, topic_records(phase.pipeline), runs, tasks),
             "listening_s": listening_s}  # fmt: skip
    say(
        f"freshness, {phase.mode}: p50 {found['p50_s']} s, p95 {found['p95_s']} s, "
        f"max {found['max_s']} s over {found['records']:,} records, {found['runs']} runs "
        f"of {found['run_s_median']} s, tasks {found['task_s_median']}"
    )
    return found


def run_freshness(stack, work: Path, rate: int, seconds: float, keys: int, warm_s: float,
                  say) -> dict:  # fmt: skip
    """The modes, one after the other, under one `airflow standalone` (and a Spark
    Connect server of its own for `connect`)."""
    pipelines = work / "freshness-pipelines"
    shutil.rmtree(pipelines, ignore_errors=True)
    pipelines.mkdir(parents=True)
    phases = [new_phase(stack, pipelines, mode, keys) for mode in MODES]
    # a long-lived server has run batches before: the same workload warms it first, for
    # `warm_s` into a table of its own (its figures dropped)
    warm = new_phase(stack, pipelines, "connect", keys, name="connect_warm") if warm_s else None
    spark = LocalSparkConnect(work / "freshness-spark-connect", free_port())
    spark.start()
    server = start_airflow(stack, work, pipelines, spark.airflow_connection())
    try:
        found = {}
        for phase in phases:
            if phase.mode == "connect" and warm is not None:
                run_phase(stack, server, warm, rate, warm_s, keys, say)
            found[phase.mode] = run_phase(stack, server, phase, rate, seconds, keys, say)
        return found
    finally:
        server.stop()
        spark.stop()
