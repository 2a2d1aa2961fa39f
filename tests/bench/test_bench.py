"""The benchmark at its smoke sizes: what each loader wrote is what the events say, and
the report has every figure (correctness only; no assertion on time).

The steps that start their own Spark application (`fixed_overhead`, `memory`) pay a JVM
start and a cold first batch each, about a minute together on the shared 2-core machine,
so the smoke run leaves them out; their own parts (the load job's output, the process
tree's peak memory) are tested here without Spark, and `make bench` runs them. The
throughput step's batch also runs in a process of its own (`cdclake_bench.batch`, its
driver JVM as a load of its size starts it), and is part of the smoke run.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable

import pyarrow.parquet as pq
import pytest
from cdclake.iceberg.catalog import load_catalog
from cdclake.raw_rows import split_envelope
from cdclake.resolve.rules import TOAST_PLACEHOLDER
from cdclake_bench.events import Workload, generate_slice
from cdclake_bench.memory import peak_memory
from cdclake_bench.report import (
    FIGURES,
    STEP_FIGURES,
    STEPS,
    committed_tables,
    job_tables,
    render_stages,
    stage_seconds,
)
from cdclake_bench.runner import Sizes, run_bench
from cdclake_bench.scaling import MERGE_ROUNDS
from cdclake_bench.sources import _file_name, recorded_ranges

pytestmark = pytest.mark.integration


def final_state(records: Iterable[tuple[int, bytes, bytes | None]]) -> dict[int, int]:
    """key -> offset of its last change, for keys that exist after all the records."""
    state: dict[int, int | None] = {}
    for offset, key, value in records:
        k = json.loads(split_envelope(key)[1])["id"]
        if value is None or json.loads(split_envelope(value)[1])["op"] == "d":
            state[k] = None
        else:
            state[k] = offset
    return {k: o for k, o in state.items() if o is not None}


def final_values(records: Iterable[tuple[int, bytes, bytes | None]], column: str) -> dict:
    """key -> the column's value in the source after all the records, for keys that
    exist then: a TOAST placeholder stands for the value before it."""
    state: dict[int, object] = {}
    gone = object()
    for _, key, value in records:
        k = json.loads(split_envelope(key)[1])["id"]
        payload = None if value is None else json.loads(split_envelope(value)[1])
        if payload is None or payload["op"] == "d":
            state[k] = gone
        elif payload["after"][column] != TOAST_PLACEHOLDER:
            state[k] = payload["after"][column]
        else:
            assert state.get(k, gone) is not gone, (k, "a placeholder for no value")
    return {k: v for k, v in state.items() if v is not gone}


def recorded(recording, topic: str):
    for r in recorded_ranges(recording):
        if r.topic == topic:
            t = pq.read_table(recording / _file_name(r.topic, r.partition)).to_pydict()
            for row in zip(t["offset"], t["key"], t["value"], strict=True):
                if r.start <= row[0] < r.end:  # the recording's range of the file
                    yield row


def generated(workload: Workload, topic: str):
    for t, partition, count in workload.slices():
        if t == topic:
            for cols in generate_slice(workload, t, partition, 0, count, set()):
                yield from zip(cols["offset"], cols["key"], cols["value"], strict=True)


def lake_rows(catalog, namespace: str, topic: str, column: str | None = "_cdc_kafka_offset"):
    table = catalog.load_table((namespace, topic.rsplit(".", 1)[1])).scan().to_arrow()
    ids = table["id"].to_pylist()
    if column is None:
        return set(ids)
    return dict(zip(ids, table[column].to_pylist(), strict=True))


def test_generator_follows_each_rows_life():
    w = Workload.standard(400, 20, tables=1, partitions=1)
    ((topic, partition, count),) = w.slices()
    cols = next(generate_slice(w, topic, partition, 0, count))
    ops, alive = [], set()
    for key, value in zip(cols["key"], cols["value"], strict=True):
        k = json.loads(split_envelope(key)[1])["id"]
        op = "tombstone" if value is None else json.loads(split_envelope(value)[1])["op"]
        if op == "c":
            assert k not in alive
            alive.add(k)
        elif op in ("u", "d"):
            assert k in alive
            if op == "d":
                alive.discard(k)
        else:
            assert ops[-1] == "d"
        ops.append(op)
    assert {"c", "u", "d", "tombstone"} <= set(ops)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"merge_rows": "100,5000"}, {"merge_rows": (100, 5000)}),  # a pair
        ({"capture_rows": "1e3"}, {"capture_rows": 1000}),  # one number, float notation
        ({}, {}),  # nothing changes
    ],
)
def test_sizes_override(overrides, expected):
    base = Sizes.at_scale(0.01)
    changed = base.replace(overrides)
    for name, value in expected.items():
        assert getattr(changed, name) == value
    assert changed.events == base.events


@pytest.mark.parametrize(
    "overrides",
    [
        {"merge_rows": "100"},  # a pair needs two numbers
        {"events": "1,2"},  # one number needs one
        {"no_such_size": "1"},
    ],
)
def test_sizes_override_rejects(overrides):
    with pytest.raises(ValueError):
        Sizes.at_scale(0.01).replace(overrides)


SPAWNING = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "b = b'x' * (300 * 2**20); import time; time.sleep(1.5)"])
time.sleep(0.2)
child.wait()
"""


def test_peak_memory_counts_the_child_processes():
    """A parent that stays small and a child that holds 300 MiB: the child must count."""
    peak, _ = peak_memory([sys.executable, "-c", SPAWNING])
    assert peak.pss > 300 * 2**20 and peak.rss > 300 * 2**20


FORKING = """
import os, time
b = bytearray(300 * 2**20)  # touched: resident
for i in range(0, len(b), 4096):
    b[i] = 1
pids = [os.fork() for _ in range(2)]  # four processes share the pages, copy-on-write
time.sleep(1.5)
for pid in pids:
    if pid:
        os.waitpid(pid, 0)
"""


def test_peak_memory_counts_pages_forked_processes_share_once():
    """Four processes mapping the same 300 MiB: RSS counts it four times, PSS once."""
    peak, _ = peak_memory([sys.executable, "-c", FORKING])
    assert peak.rss > 1000 * 2**20
    assert 300 * 2**20 < peak.pss < 500 * 2**20


def test_peak_memory_reports_a_failed_command():
    with pytest.raises(RuntimeError, match="failed"):
        peak_memory([sys.executable, "-c", "import sys; sys.exit(3)"])


def test_committed_tables_finds_the_job_lines_among_spark_output():
    result = {"batch_id": "b", "tables": [{"status": "committed"}, {"status": "skipped"}]}
    stdout = "\n".join(["Ivy Default Cache set to: /root/.ivy2", json.dumps(result),
                        json.dumps({**result, "batch_id": "c"}), "done"])  # fmt: skip
    assert committed_tables(stdout) == 2
    with pytest.raises(RuntimeError, match="no batch result"):
        committed_tables("only spark logging\n")


def test_stage_seconds_sum_the_tables_and_take_the_batch_read_once():
    tables = [
        {"seconds": {"read": 2.0, "state": 0.5, "resolve": 3.0, "write": 1.0}},
        {"seconds": {"read": 2.0, "state": 0.25, "resolve": 1.0, "write": 2.0}},
        {"seconds": {"read": 2.0}},  # skipped before its stages (nothing to load)
    ]
    stdout = "spark says hello\n" + json.dumps({"batch_id": "b", "tables": tables})
    stages = stage_seconds(job_tables(stdout), parallel_tables=4)
    assert stages == {"read_s": 2.0, "state_s": 0.75, "resolve_s": 4.0, "write_s": 3.0,
                      "tables": 3, "parallel_tables": 4}  # fmt: skip
    line = render_stages({"fixed_overhead": {"stages": stages}})
    assert "fixed_overhead: read 2.0s" in line and "resolve 4.0s" in line
    line = render_stages({"throughput_merge": {"stages": stages}})
    assert "throughput_merge: read 2.0s" in line and "write 3.0s" in line


BURNING = """
import subprocess, sys, threading, time

BURN = '''
import time

def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
'''
exec(BURN)
input()  # the snapshot before
t = threading.Thread(target=burn, args=(0.4,))
t.start(); t.join()  # a thread that ends before the snapshot after
child = BURN + "burn(0.6); print('burnt', flush=True); time.sleep(60)"
kid = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE)
kid.stdout.readline()
print("done", flush=True)
time.sleep(60)
"""


def test_cpu_parts_split_a_process_tree_by_part():
    """Snapshots from outside, before and after: the top process's ended thread counts
    for it (through its total), a child process of another kind for its own part."""
    import subprocess

    from cdclake_bench.cpu import cpu_parts, cpu_snapshot, render_parts

    proc = subprocess.Popen([sys.executable, "-c", BURNING], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        before = cpu_snapshot(proc.pid)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "done"
        parts = cpu_parts(before, cpu_snapshot(proc.pid))
    finally:
        for p in __import__("psutil").Process(proc.pid).children(recursive=True):
            p.kill()
        proc.kill()
    assert set(parts) == {"Python driver", "other processes"}, parts
    assert 0.35 <= parts["Python driver"] < 1.5, parts
    assert 0.55 <= parts["other processes"] < 1.5, parts
    assert render_parts(parts).endswith("CPU s in all")
    total = sum(parts.values())
    assert render_parts(parts, 2).endswith(f"in all, at least {total / 2:,.1f}s of wall on 2 cores")


@pytest.mark.parametrize(
    ("process", "thread", "part"),
    [
        ("jvm", "Executor task l", "JVM executor tasks"),
        ("jvm", "C2 CompilerThre", "JVM compilers"),
        ("jvm", "C1 CompilerThre", "JVM compilers"),
        ("jvm", "GC Thread#1", "JVM garbage collector"),
        ("jvm", "G1 Conc#0", "JVM garbage collector"),
        ("jvm", "Thread-4", "JVM driver and other threads"),
        ("python worker", "python", "Python workers"),
        ("driver", "python", "Python driver"),
        ("other", "bash", "other processes"),
    ],
)
def test_thread_parts(process, thread, part):
    from cdclake_bench.cpu import thread_part

    assert thread_part(process, thread) == part


# freshness runs Airflow's scheduler for minutes whatever the size; tests/e2e/test_watch.py
# runs its event-driven path, and test_freshness_* below its figures' arithmetic;
# throughput_connect starts a Spark Connect server (tests/integration/test_spark_connect.py
# loads through one)
SLOW_STEPS = ("fixed_overhead", "memory", "freshness", "throughput_connect")
SMOKE_STEPS = [s for s in STEPS if s not in SLOW_STEPS]


def test_bench_smoke_reports_every_figure_and_loads_the_events(stack, tmp_path):
    sizes = Sizes.smoke()
    out = tmp_path / "bench.json"
    report = run_bench(0, tmp_path / "work", out, only=SMOKE_STEPS, sizes=sizes)
    written = json.loads(out.read_text())

    assert not written["details"].get("errors"), written["details"].get("errors")
    assert set(written["details"]["step_wall_s"]) == set(SMOKE_STEPS)
    assert set(written["details"]["skipped"]) == set(STEPS) - set(SMOKE_STEPS)
    assert set(written["figures"]) == set(FIGURES)
    for step, names in STEP_FIGURES.items():
        for name in names:
            value = written["figures"][name]
            assert isinstance(value, float) if step in SMOKE_STEPS else value is None, name
    assert written["figures"] == pytest.approx(report["figures"])
    assert written["sizes"]["merge_rows"] == list(sizes.merge_rows)
    assert written["sizes"]["memory_events"] == list(sizes.memory_events)

    catalog = load_catalog_for(stack)
    recording = tmp_path / "work" / "recording"
    topics = sorted({r.topic for r in recorded_ranges(recording)})
    assert len(topics) == sizes.tables
    details = written["details"]
    for topic in topics:
        expected = final_state(recorded(recording, topic))
        assert expected  # the smoke workload leaves rows behind
        assert lake_rows(catalog, details["throughput"]["namespace"], topic) == expected
        # the peers did the same work (the handler's way in calls of `peer_batch` events)
        peers = details["peers"]
        for ns in (peers["handler_namespace"], peers["one_call_namespace"],
                   peers["naive_namespace"]):  # fmt: skip
            assert lake_rows(catalog, ns, topic, column=None) == set(expected)

    # a first load of one half of a history, then its second half MERGEd into it
    merged = details["throughput_merge"]
    assert merged["first_load"]["namespace"] == merged["namespace"]
    assert merged["written_by"] == ["merge"], merged["written_by"]
    assert merged["events"] == sizes.events
    split = tmp_path / "work" / "recording-merge"
    for topic in topics:
        expected = final_state(recorded(split, topic))  # after both halves
        assert lake_rows(catalog, merged["namespace"], topic) == expected
        # and so did pyiceberg's upsert, into tables that held the first half
        assert lake_rows(catalog, merged["peer"]["namespace"], topic, column=None) == set(expected)
        # the second half changed the table
        assert final_state(recorded(split / "first", topic)) != expected
        # the same MERGE and upsert into tables that also hold filler rows of other keys
        big = details["throughput_merge_big"]
        filler = set(range(sizes.keys + 1, sizes.keys + 1 + sizes.merge_rows[1] // sizes.tables))
        sides = ((big["namespace"], "_cdc_kafka_offset"), (big["peer"]["namespace"], None))
        for ns, column in sides:
            found = lake_rows(catalog, ns, topic, column=column)
            assert set(found) - set(expected) == filler, ns
            if column is not None:
                assert {k: v for k, v in found.items() if k in expected} == expected
            else:
                assert found & set(expected) == set(expected)

    assert details["peers"]["handler_events"] == sizes.events > 2 * sizes.peer_batch
    assert details["peers"]["handler_calls"] == -(-sizes.events // sizes.peer_batch)
    toast = details["throughput_toast"]
    assert len(toast["wall_s"]["plain"]) == len(toast["wall_s"]["toast"]) == 2
    toasted = tmp_path / "work" / "recording-toast"
    placeholders = 0
    for topic in topics:
        column = toast["columns"][topic]
        records = list(recorded(toasted, topic))
        placeholders += sum(v is not None and TOAST_PLACEHOLDER.encode() in v
                            for _, _, v in records)  # fmt: skip
        expected = final_values(records, column)
        for ns in toast["namespaces"]:
            assert lake_rows(catalog, ns, topic) == final_state(records)
            assert lake_rows(catalog, ns, topic, column=column) == expected
    assert placeholders > 0

    kafka = details["throughput_kafka"]
    workload = Workload.standard(sizes.kafka_events, sizes.kafka_keys,
                                 prefix=kafka["topic_prefix"], tables=sizes.tables)  # fmt: skip
    for stream in workload.streams:
        expected = final_state(generated(workload, stream.topic))
        assert lake_rows(catalog, kafka["namespace"], stream.topic) == expected

    # where the time went, from the tables' own timings
    stages = details["throughput"]["stages"]
    assert stages["tables"] == sizes.tables
    # (the tables are resolved range by range while they are read: in `read_s`)
    assert stages["read_s"] > 0 and stages["resolve_s"] >= 0 and stages["write_s"] > 0
    # and the CPU of the batch's process tree by part (the JVM plans, runs and writes)
    for cpu in (details["throughput"]["cpu_s"], merged["cpu_s"]):
        assert cpu.get("JVM executor tasks", 0) > 0 and cpu.get("Python driver", 0) > 0, cpu
    assert "  CPU: " in render_stages(details)

    merges = details["merge_scaling"]
    assert set(merges) == {"batch", "walls_s", *(f"rows_{n}_s" for n in sizes.merge_rows)}
    assert [len(w) for w in merges["walls_s"].values()] == [MERGE_ROUNDS] * 2  # timed ones
    assert details["capture"]["rows"] == sizes.capture_rows
    v3 = details["deletes_v3"]
    assert [len(v3["walls_s"][v]) for v in ("2", "3")] == [sizes.v3_batches] * 2
    assert set(v3["scans_s"]["3"]) == {"after_batches_s", "after_maintenance_s"}


def load_catalog_for(stack):
    from cdclake.config import CatalogConfig

    s = stack.s
    return load_catalog(
        CatalogConfig(
            name="lake",
            type="jdbc",
            uri=f"jdbc:postgresql://127.0.0.1:{s.pg_port}/{s.catalog_db}",
            warehouse=(s.state_dir / "warehouse").as_uri(),
            properties={"jdbc.user": "postgres", "jdbc.password": ""},
        )
    )


def test_a_run_builds_the_jvm_archive_once_and_says_so(tmp_path, monkeypatch):
    """The archive a deployed load's driver maps is built before the steps (untimed)
    when missing; the report says whether it was there, built, or could not be."""
    import cdclake_bench.runner as runner
    from cdclake.exceptions import CdclakeError

    archive = tmp_path / "driver.jsa"
    built = []

    def build(path):
        built.append(path)
        path.write_bytes(b"archive")
        return path

    monkeypatch.setattr(runner, "archive_path", lambda: archive)
    monkeypatch.setattr(runner, "build_archive", build)
    bench = runner.Bench(0, tmp_path, None, Sizes.smoke())
    bench.jvm_archive()
    bench.jvm_archive()  # once a run
    assert built == [archive] and archive.is_file()
    found = bench.details["jvm_archive"]
    assert found["present"] is False and found["built_s"] >= 0 and "error" not in found

    bench = runner.Bench(0, tmp_path, None, Sizes.smoke())
    bench.jvm_archive()  # there now: not built again
    assert built == [archive] and bench.details["jvm_archive"]["present"] is True

    def broken(path):
        raise CdclakeError("no spark-submit")

    archive.unlink()
    monkeypatch.setattr(runner, "build_archive", broken)
    bench = runner.Bench(0, tmp_path, None, Sizes.smoke())
    bench.jvm_archive()
    assert bench.details["jvm_archive"]["error"] == "no spark-submit"


def test_freshness_latency_is_first_poll_that_saw_a_record_committed():
    from cdclake_bench.freshness import Poll, lag_growth, latencies_s, percentile

    polls = [Poll(1000, {}, {0: 5}), Poll(2000, {0: 3}, {0: 8}), Poll(3000, {0: 8}, {0: 8})]
    records = [(0, 0, 500), (0, 2, 900), (0, 3, 1500), (0, 7, 2500), (0, 8, 2900)]
    lat, unseen = latencies_s(polls, records)
    # offsets 0 and 2 seen committed at 2000, 3 and 7 at 3000, 8 never
    assert lat == [1.5, 1.1, 1.5, 0.5] and unseen == 1
    assert percentile(lat, 0.5) == 1.5 and percentile(lat, 0.95) == 1.5
    assert [p.behind for p in polls] == [5, 5, 0]

    steady = [Poll(t, {0: 0}, {0: 10 if t % 2 else 20}) for t in range(0, 90)]
    assert lag_growth(steady, 0, 90)["growth"] == pytest.approx(1.0, abs=0.1)
    growing = [Poll(t, {0: 0}, {0: t}) for t in range(0, 90)]
    assert lag_growth(growing, 0, 90)["growth"] > 1.4


def test_freshness_tasks_are_their_median_successful_runs():
    from cdclake_bench.freshness import _task_times

    tasks = [{"task_id": "load", "state": "success", "duration": d} for d in (3.0, 9.0, 4.0)]
    tasks += [{"task_id": "plan", "state": "success", "duration": 0.5},
              {"task_id": "plan", "state": "failed", "duration": 60.0},
              {"task_id": "report", "state": "running", "duration": None}]  # fmt: skip
    assert _task_times(tasks) == {"load": 4.0, "plan": 0.5}
