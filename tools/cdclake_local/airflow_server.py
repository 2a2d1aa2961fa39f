"""`airflow standalone` (api-server, scheduler, dag-processor, triggerer) in an
AIRFLOW_HOME, driven through its REST API as the admin user: for the benchmark's freshness
step and the tests that need the real scheduler and triggerer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from cdclake.exceptions import StackError

from cdclake_local.airflow_home import PASSWORDS_FILE, airflow_env, api_url
from cdclake_local.procs import wait_for

START_S = 180  # every component healthy
REQUEST_S = 20


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
            self.token = self._login(self._password(passwords))
        except Exception:
            self.stop()
            raise
        return self

    def _healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise StackError(f"airflow standalone exited {self.proc.returncode}\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"{self.base}/api/v2/monitor/health", timeout=5) as r:
                health = json.loads(r.read())
        except OSError:
            return False
        return all(part.get("status") == "healthy" for part in health.values())

    def tail(self, lines: int = 40) -> str:
        """The end of its log, without the line that prints the admin password."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        kept = [line for line in text.splitlines() if "assword" not in line]
        return f"--- {self.log}\n" + "\n".join(kept[-lines:])

    @staticmethod
    def _password(path: Path) -> str | None:
        try:
            return json.loads(path.read_text() or "{}").get("admin")
        except (OSError, ValueError):
            return None

    def _login(self, password: str) -> str:
        body = {"username": "admin", "password": password}
        return self.request("POST", "/auth/token", body, auth=False)["access_token"]

    def request(self, method: str, path: str, body: dict | None = None, auth: bool = True):
        """JSON of an API call; None for a 404."""
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
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
        """SIGTERM to the process group, then SIGKILL to what is left of it."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        time.sleep(2)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        self.proc = None
