"""`airflow standalone` (api-server, scheduler, dag-processor, triggerer) in an
AIRFLOW_HOME, driven through its REST API as the admin user: for the benchmark's freshness
step and the tests that need the real scheduler and triggerer.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from cdclake_local import StackError
from cdclake_local.airflow_home import PASSWORDS_FILE, airflow_env, api_url
from cdclake_local.procs import processes, wait_for

START_S = 180  # every component healthy
REQUEST_S = 20


def free_port() -> int:
    """A port the kernel says is free now (the api-server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(base: str) -> bool:
    """Whether every component the api-server at `base` reports on is healthy."""
    try:
        with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=5) as resp:
            health = json.loads(resp.read())
    except OSError:
        return False
    return all(part.get("status") == "healthy" for part in health.values())


def api_token(base: str, password: str) -> str:
    """A JWT for `admin` from the api-server at `base` (Airflow's simple auth manager)."""
    req = urllib.request.Request(
        f"{base}/auth/token",
        data=json.dumps({"username": "admin", "password": password}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=REQUEST_S) as resp:
        return json.loads(resp.read())["access_token"]


def log_tail(path: Path, lines: int = 40) -> str:
    """The end of a log, without the line in which Airflow prints a generated password."""
    if not path.exists():
        return f"({path} does not exist)"
    text = path.read_text(errors="replace")
    kept = [line for line in text.splitlines() if "assword" not in line]
    return f"--- {path} (last {lines} lines)\n" + "\n".join(kept[-lines:])


def _standalone_of(home: Path, pid: int, cmdline: bytes) -> bool:
    if b"airflow\0standalone" not in cmdline:
        return False
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    homes = [v.split(b"=", 1)[1] for v in environ if v.startswith(b"AIRFLOW_HOME=")]
    return any(Path(os.fsdecode(h)).resolve() == home.resolve() for h in homes)


def stop_airflow(home: Path, timeout: float = 10.0) -> int:
    """Stop the `airflow standalone` started from `home` and every Airflow process of it
    (what it started, and what those forked, left behind too): SIGTERM, then SIGKILL
    after `timeout`. Its Ctrl+C can leave the scheduler hung: standalone signals it again
    while it logs the first signal. How many processes there were."""
    procs = processes()
    mine = {p for p, (_, _, cmd) in procs.items() if _standalone_of(home, p, cmd)}
    groups = {procs[p][1] for p in mine}
    while True:  # their descendants, and the Airflow processes of their groups
        more = {p for p, (ppid, group, cmd) in procs.items() if p not in mine and (
            ppid in mine or (group in groups and b"airflow" in cmd))}  # fmt: skip
        if not more:
            break
        mine |= more
    left = mine
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            now = processes()  # still the same process: a reused pid is not one of them
            left = {p for p in left if p in now and now[p][2] == procs[p][2]}
    return len(mine)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group `proc` leads, then SIGKILL to whatever of it is left
    (Airflow's dag-processor may linger)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    time.sleep(2)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


class AirflowServer:
    """One `airflow standalone` process group; `env` is added to the home's environment
    (a pipelines folder, the stack's endpoints)."""

    def __init__(self, home: Path, port: int, env: Mapping[str, str], log: Path):
        self.home, self.log = home, log
        self.base = api_url(port)
        self.env = {**airflow_env(home), **env}
        self.proc: subprocess.Popen | None = None
        self.token = ""

    def start(self) -> AirflowServer:
        airflow = str(Path(sys.executable).parent / "airflow")
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [airflow, "standalone"], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        try:
            wait_for(f"airflow standalone healthy (log {self.log})", self._healthy, START_S)
            passwords = self.home / PASSWORDS_FILE
            wait_for("the admin password", lambda: bool(self._password(passwords)), 30)
            self.token = api_token(self.base, self._password(passwords))
        except Exception:
            self.stop()
            raise
        return self

    def _healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise StackError(f"airflow standalone exited {self.proc.returncode}\n{self.tail()}")
        return healthy(self.base)

    def tail(self, lines: int = 40) -> str:
        return log_tail(self.log, lines)

    @staticmethod
    def _password(path: Path) -> str | None:
        try:
            return json.loads(path.read_text() or "{}").get("admin")
        except (OSError, ValueError):
            return None

    def request(self, method: str, path: str, body: dict | None = None):
        """JSON of an API call as admin; None for a 404."""
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"}
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_S) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise StackError(f"{method} {self.base}{path}: HTTP {exc.code} "
                             f"{exc.read()[:500]!r}") from exc  # fmt: skip

    def dag(self, dag_id: str) -> dict | None:
        return self.request("GET", f"/api/v2/dags/{dag_id}")

    def unpause(self, dag_id: str) -> None:
        self.request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def pause(self, dag_id: str) -> None:
        self.request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": True})

    def runs(self, dag_id: str) -> list[dict]:
        """The DAG's runs, oldest first."""
        query = urllib.parse.urlencode({"limit": 1000, "order_by": "run_after"})
        found = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns?{query}")
        return found["dag_runs"] if found else []

    def task_instances(self, dag_id: str) -> list[dict]:
        """The task instances of every run of the DAG."""
        query = urllib.parse.urlencode({"limit": 1000})
        found = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/~/taskInstances?{query}")
        return found["task_instances"] if found else []

    def asset_events(self, name: str) -> list[dict]:
        """The events of the asset called `name`, oldest first."""
        assets = self.request("GET", "/api/v2/assets?" + urllib.parse.urlencode(
            {"name_pattern": name}))["assets"]  # fmt: skip
        ids = [a["id"] for a in assets if a["name"] == name]
        if not ids:
            return []
        query = urllib.parse.urlencode({"asset_id": ids[0], "limit": 1000, "order_by": "timestamp"})
        return self.request("GET", f"/api/v2/assets/events?{query}")["asset_events"]

    def stop(self) -> None:
        """Stop the process group (`stop_group`)."""
        if self.proc is not None:
            stop_group(self.proc)
            self.proc = None
