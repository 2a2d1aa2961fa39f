"""`cdclake local up | status | down` on a stack of its own (own state dir and ports)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from cdclake_local.postgres import LocalPostgres
from cdclake_local.procs import pid_alive

from tests.conftest import ROOT

pytestmark = pytest.mark.integration


# below the kernel's ephemeral range (32768-60999 here): a client socket of another test
# can take a port inside it at any moment; beside the test stack's own ports
PG_PORT = int(os.environ.get("CDCLAKE_TEST_PG_PORT", "25442")) + 10
KAFKA_PORT = int(os.environ.get("CDCLAKE_TEST_KAFKA_PORT", "19102")) + 10


def cli(state: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "CDCLAKE_STATE_DIR": str(state),
        "CDCLAKE_PG_PORT": str(PG_PORT),
        "CDCLAKE_KAFKA_PORT": str(KAFKA_PORT),
    }
    return subprocess.run([sys.executable, "-m", "cdclake", "local", *args], env=env,
                          capture_output=True, text=True, cwd=ROOT, timeout=600)  # fmt: skip


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmd:
                found.append(int(entry.name))
    return found


def test_port_taken_by_another_process_is_named(tmp_path):
    import socket

    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", PG_PORT))
        squatter.listen()
        res = cli(tmp_path / "other", "up")
    assert res.returncode == 2
    assert f"port {PG_PORT} is already in use" in res.stderr
    assert processes_mentioning(str(tmp_path / "other")) == []


def customers(status: dict) -> list[int]:
    with psycopg.connect(status["postgres"]["source_dsn"], connect_timeout=10) as conn:
        rows = conn.execute("select id from inventory.customers order by id").fetchall()
    return [r[0] for r in rows]


def stream_ends(status: dict) -> tuple[int, int]:
    """The customers topic's (earliest, end) offsets, once the capture sent everything."""
    from cdclake_local.stack import LocalStack, StackSettings
    from confluent_kafka import Consumer, TopicPartition

    settings = StackSettings(Path(status["state_dir"]), pg_port=PG_PORT, kafka_port=KAFKA_PORT,
                             connect_port=KAFKA_PORT + 2)  # fmt: skip
    stack = LocalStack(settings)
    stack.wait_for_capture()
    consumer = Consumer({**stack.broker.client_config(), "group.id": "t"})
    try:
        tp = TopicPartition("demo.inventory.customers", 0)
        return consumer.get_watermark_offsets(tp, timeout=10)
    finally:
        consumer.close()


def catalog_oid(status: dict) -> int:
    with psycopg.connect(status["postgres"]["dsn"], connect_timeout=10) as conn:
        return conn.execute("select oid from pg_database where datname = 'cdclake_catalog'"
                            ).fetchone()[0]  # fmt: skip


def test_up_is_idempotent_keeps_the_source_and_down_leaves_nothing(tmp_path):
    """`up` on a running stack changes nothing (same processes); `status` lists the
    endpoints; rows deleted in the source stay deleted through `up`, `down` and `up`, and
    Kafka keeps the stream on disk, so the stream and the lake are kept too; `down`
    leaves no process behind."""
    state = tmp_path / "stack"
    try:
        first = cli(state, "up")
        assert first.returncode == 0, first.stderr[-3000:]
        status = json.loads(cli(state, "status", "--json").stdout)
        assert status["postgres"]["dsn"].endswith(f"127.0.0.1:{PG_PORT}/postgres")
        assert status["kafka"]["bootstrap"] == f"127.0.0.1:{KAFKA_PORT}"
        assert status["catalog"]["uri"] == f"jdbc:postgresql://127.0.0.1:{PG_PORT}/cdclake_catalog"
        assert status["catalog"]["warehouse"] == (state / "warehouse").as_uri()
        assert status["airflow"]["home"] == str(state / "airflow")
        assert all(status[p]["running"] for p in ("postgres", "kafka", "capture"))
        pids = {p: status[p]["pid"] for p in ("postgres", "kafka", "capture")}
        pg_home = (state / "postgres" / "location").read_text().strip()
        seeded = customers(status)
        assert 1004 in seeded  # a new database is seeded
        with psycopg.connect(status["postgres"]["source_dsn"], autocommit=True) as conn:
            conn.execute("delete from inventory.customers where id = 1004")
            conn.execute("insert into inventory.customers values (2001, 'A', 'B', 'a@b.c')")
        expected = sorted({*seeded, 2001} - {1004})

        again = cli(state, "up")  # on the running stack
        assert again.returncode == 0, again.stderr[-3000:]
        assert {p: json.loads(again.stdout)[p]["pid"] for p in pids} == pids
        assert customers(status) == expected
        stream, catalog = stream_ends(status), catalog_oid(status)
        assert stream[1] > 0  # the snapshot and the changes above
        _assert_down_leaves_nothing(state, pids.values(), pg_home)
        restarted = cli(state, "up")  # the cluster started again, the database kept
        assert restarted.returncode == 0, restarted.stderr[-3000:]
        assert customers(json.loads(restarted.stdout)) == expected
        # the stream and the lake are kept: no new snapshot, no catalog made again
        assert stream_ends(status) == stream
        assert catalog_oid(status) == catalog
    finally:
        down = cli(state, "down")
    assert down.returncode == 0, down.stderr
    assert processes_mentioning(str(state)) == []


def _assert_down_leaves_nothing(state: Path, pids, pg_home: str) -> None:
    down = cli(state, "down")
    assert down.returncode == 0, down.stderr
    assert not [p for p in pids if pid_alive(p)]
    assert processes_mentioning(str(state)) == []
    assert processes_mentioning(pg_home) == []
    status = json.loads(cli(state, "status", "--json").stdout)
    assert not any(status[p]["running"] for p in ("postgres", "kafka", "capture"))


def databases(postgres: LocalPostgres) -> set[str]:
    with psycopg.connect(postgres.dsn, connect_timeout=10) as conn:
        return {r[0] for r in conn.execute("select datname from pg_database")}


@pytest.mark.skipif(os.geteuid() != 0, reason="only root's clusters live apart from the state")
@pytest.mark.parametrize("left_running", [False, True])
def test_a_new_state_directory_never_adopts_the_cluster_of_a_deleted_one(tmp_path, left_running):
    """Run as root, a cluster lives under /var/lib/cdclake when the `postgres` user cannot
    reach the state directory; a state directory made again at the same path starts
    empty, whether the old cluster was stopped or left running."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)  # the postgres user cannot traverse it
    old = LocalPostgres(private / "postgres", PG_PORT)
    assert not old.home.is_relative_to(private)
    try:
        old.start()
        old.ensure_database("left_behind")
        old_pid = old.pid()
    finally:
        if not left_running:
            old.stop()
    shutil.rmtree(private / "postgres")

    new = LocalPostgres(private / "postgres", PG_PORT)
    assert new.home == old.home
    try:
        new.start()
        assert "left_behind" not in databases(new)
        assert not pid_alive(old_pid)
    finally:
        new.stop()
        shutil.rmtree(new.home, ignore_errors=True)
