"""Killing spark-submit (what SparkSubmitOperator does on timeout or kill) takes the
PySpark driver with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cdclake_local.procs import pid_alive

from tests.conftest import ROOT

pytestmark = pytest.mark.integration


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().split(")")[-1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def test_driver_dies_with_spark_submit():
    submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    proc = subprocess.Popen(
        [str(submit), "--master", "local[1]", str(ROOT / "tests" / "data" / "sleepy_driver.py")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "driver ready"
        drivers = [
            c
            for c in children(proc.pid)
            if "sleepy_driver" in Path(f"/proc/{c}/cmdline").read_text()
        ]
        assert drivers, "the Python driver should be a child of spark-submit"
        os.kill(proc.pid, signal.SIGKILL)  # as SparkSubmitHook.on_kill does
        proc.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(pid_alive(d) for d in drivers):
            time.sleep(0.2)
        assert not any(pid_alive(d) for d in drivers)
    finally:
        if proc.poll() is None:
            proc.kill()
