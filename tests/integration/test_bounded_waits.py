"""Endpoints that do not answer: `cdclake` as users run it fails within a bound, naming
the endpoint it used.

A server that accepts TCP connections and never says a word (a hung process, a
firewall that lets the handshake through) and a port where nothing listens, pointed
at as the Kafka bootstrap servers, the JDBC catalog's PostgreSQL, a REST catalog and
the source database. No stack is needed: each command meets the broken endpoint first.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration

# the defaults (connect 10 s, request 30 s) end every wait within ~30 s; generous for
# a busy 2-core machine and the CLI's start-up: a correctness bound, not a speed target
BOUND_S = 60


@pytest.fixture(scope="module")
def silent() -> Iterator[int]:
    """A port whose server accepts every connection and never answers."""
    server = socket.create_server(("127.0.0.1", 0), backlog=64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


@pytest.fixture(scope="module")
def closed() -> int:
    """A port where nothing listens (bound once to find a free one, then released)."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]


def pipeline_file(tmp_path: Path, *, kafka: str, catalog: str, extra: str = "") -> Path:
    path = tmp_path / "bounded.yaml"
    path.write_text(
        f"""
name: bounded
topic_prefix: pg
kafka: {kafka}
catalog: {catalog}
namespace: bounded
{extra}
"""
    )
    return path


JDBC = "{{name: lake, type: jdbc, uri: 'jdbc:postgresql://127.0.0.1:{port}/cat', warehouse: wh}}"
REST = "{{name: lake, type: rest, uri: 'http://127.0.0.1:{port}', warehouse: wh}}"
UNUSED_KAFKA = "{bootstrap_servers: '127.0.0.1:1'}"  # never reached: the catalog fails first


def cdclake(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    """`python -m cdclake <args>` as users run it, and how long it took."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "cdclake", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=BOUND_S * 4,
    )  # fmt: skip
    return time.monotonic() - started, done


def assert_fails_naming(elapsed: float, done: subprocess.CompletedProcess, endpoint: str):
    assert done.returncode == 2, done.stderr[-3000:]
    assert elapsed < BOUND_S, f"took {elapsed:.0f}s: {done.stderr[-3000:]}"
    error = [line for line in done.stderr.splitlines() if line.startswith("cdclake: error:")]
    assert error and endpoint in error[0], done.stderr[-3000:]
    assert "check" in error[0]  # and says what to look at


@pytest.mark.parametrize("where", ["silent", "closed"])
def test_plan_with_kafka_that_does_not_answer(tmp_path, request, where):
    port = request.getfixturevalue(where)
    # a table pattern: plan asks Kafka for the captured topics before it reads the catalog
    path = pipeline_file(
        tmp_path, kafka=f"{{bootstrap_servers: '127.0.0.1:{port}'}}",
        catalog=JDBC.format(port=1), extra="tables: ['inventory.*']",
    )  # fmt: skip
    assert_fails_naming(*cdclake("plan", "--pipeline", str(path)), f"127.0.0.1:{port}")


def test_kafka_errors_name_the_servers_the_properties_set(tmp_path, silent):
    kafka = (
        "{bootstrap_servers: 'top-level.invalid:9092', "
        f"properties: {{bootstrap.servers: '127.0.0.1:{silent}'}}}}"
    )
    path = pipeline_file(
        tmp_path, kafka=kafka, catalog=JDBC.format(port=1), extra="tables: ['inventory.*']"
    )
    elapsed, done = cdclake("plan", "--pipeline", str(path))
    assert_fails_naming(elapsed, done, f"127.0.0.1:{silent}")
    assert "top-level.invalid" not in done.stderr


def test_the_pipeline_files_timeouts_shorten_the_wait(tmp_path, silent):
    path = pipeline_file(
        tmp_path, kafka=f"{{bootstrap_servers: '127.0.0.1:{silent}'}}",
        catalog=JDBC.format(port=1),
        extra="tables: ['inventory.*']\ntimeouts: {connect_s: 2, request_s: 3}",
    )  # fmt: skip
    elapsed, done = cdclake("plan", "--pipeline", str(path))
    assert_fails_naming(elapsed, done, f"127.0.0.1:{silent}")
    assert "connect 2s, request 3s" in done.stderr


@pytest.mark.parametrize("where", ["silent", "closed"])
@pytest.mark.parametrize("catalog", [JDBC, REST], ids=["jdbc", "rest"])
def test_plan_with_a_catalog_that_does_not_answer(tmp_path, request, where, catalog):
    port = request.getfixturevalue(where)
    path = pipeline_file(
        tmp_path, kafka=UNUSED_KAFKA, catalog=catalog.format(port=port),
        extra="tables: [inventory.orders]",
    )  # fmt: skip
    assert_fails_naming(*cdclake("plan", "--pipeline", str(path)), f"127.0.0.1:{port}")


@pytest.mark.parametrize("where", ["silent", "closed"])
def test_snapshot_with_a_source_database_that_does_not_answer(tmp_path, request, where):
    port = request.getfixturevalue(where)
    path = pipeline_file(
        tmp_path, kafka=UNUSED_KAFKA, catalog=JDBC.format(port=1),
        extra="tables: [inventory.orders]",
    )  # fmt: skip
    dsn = f"host=127.0.0.1 port={port} dbname=inventory user=cdclake password=not-shown"
    elapsed, done = cdclake(
        "snapshot", "--pipeline", str(path), "--table", "inventory.orders",
        "--source-dsn", dsn, "--no-follow",
    )  # fmt: skip
    assert_fails_naming(elapsed, done, f"127.0.0.1:{port}")
    assert "not-shown" not in done.stderr
