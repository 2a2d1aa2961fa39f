"""A Spark Connect server for the local stack: Spark's own long-lived driver
(`SparkConnectServer`, `stack/spark-connect`), started by the installed PySpark's
spark-submit with the settings of a load's driver (`cdclake.spark.DRIVER_CONF`) and the
Iceberg jars, so that loads (`spark.connect_conn_id`, or `CDCLAKE_SPARK_REMOTE` for the
CLI) skip a JVM's start.

Spark Connect 3.5 has no authentication and listens on every interface: the server runs
with `stack/spark-connect/ConnectGuard.java` (compiled here with the JDK's javac), which
takes calls from loopback addresses only and carrying the stack's token
(`x-cdclake-token`, kept in a file readable by its owner only).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from cdclake.spark import DRIVER_CONF, DRIVER_PYTHON, PYTHON, remote_url

from cdclake_local import StackError, maven
from cdclake_local.procs import port_free, running, secret, start_daemon, stop_daemon, wait_started

MAIN = "org.apache.spark.sql.connect.service.SparkConnectServer"
GUARD = maven.STACK / "spark-connect" / "ConnectGuard.java"
START_TIMEOUT_S = 120
ENABLE_ENV = "CDCLAKE_SPARK_CONNECT"  # 1: `cdclake local up` starts the server too
PORT_ENV = "CDCLAKE_SPARK_CONNECT_PORT"


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "").strip() == "1"


class LocalSparkConnect:
    """The server on 127.0.0.1:`port`, its Python workers this environment's Python."""

    def __init__(self, root: Path, port: int, master: str = "local[2]") -> None:
        self.root = root
        self.port = port
        self.master = master
        self.pidfile = root / "spark-connect.pid"
        self.logfile = root / "spark-connect.log"
        self.token_file = root / "token"

    def token(self) -> str:
        return secret(self.token_file)

    @property
    def remote(self) -> str:
        """The URL a client reaches it by, its token in it (never logged)."""
        return remote_url("127.0.0.1", self.port, self.token())

    def airflow_connection(self) -> dict[str, object]:
        """The server as an Airflow `spark_connect` connection (the token its password)."""
        return {"conn_type": "spark_connect", "host": "127.0.0.1", "port": self.port,
                "password": self.token()}  # fmt: skip

    def pid(self) -> int | None:
        return running(self.pidfile)

    def start(self) -> float:
        """Start the server unless it runs; the seconds it took to answer (0 when it ran)."""
        if self.pid() is not None:
            return 0.0
        if not port_free(self.port):
            raise StackError(f"port {self.port} (the local Spark Connect server) is in use by "
                             f"another process; stop it or set {PORT_ENV}")  # fmt: skip
        self.root.mkdir(parents=True, exist_ok=True)
        plugin = _one_jar(maven.jars("spark-connect"), "spark-connect_2.12-")
        spark = maven.jars("spark")
        jars = [_one_jar(spark, p) for p in ("iceberg-spark-runtime-", "iceberg-aws-bundle-",
                                              "postgresql-")]  # fmt: skip
        classes = self._guard(plugin)
        conf = {
            **DRIVER_CONF,
            PYTHON: sys.executable,
            DRIVER_PYTHON: sys.executable,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.connect.grpc.interceptor.classes": "cdclake.ConnectGuard",
            # the guard and the plugin on the driver's own class path: the guard implements
            # the plugin's (shaded) gRPC interface
            "spark.driver.extraClassPath": f"{plugin}{os.pathsep}{classes}",
        }
        submit = Path(sys.executable).parent / "spark-submit"
        cmd = [str(submit), "--master", self.master, "--class", MAIN,
               "--jars", ",".join(str(j) for j in jars)]  # fmt: skip
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        cmd.append("spark-internal")
        env = {**os.environ, "CDCLAKE_CONNECT_TOKEN": self.token(),
               "PATH": f"{submit.parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
        started = time.monotonic()
        start_daemon(cmd, self.pidfile, self.logfile, env=env)
        wait_started(f"the Spark Connect server on port {self.port}", self.pidfile,
                     self.logfile, self._answers, START_TIMEOUT_S)  # fmt: skip
        return time.monotonic() - started

    def stop(self) -> bool:
        return stop_daemon(self.pidfile, timeout=30)

    def _guard(self, plugin: Path) -> Path:
        """ConnectGuard compiled against the plugin's gRPC (again when its source changed)."""
        out = self.root / "guard"
        built = out / "cdclake" / "ConnectGuard.class"
        if built.exists() and built.stat().st_mtime >= GUARD.stat().st_mtime:
            return out
        javac = shutil.which("javac")
        if javac is None:
            raise StackError("the Spark Connect server's guard needs a JDK's javac: "
                             "apt-get install openjdk-17-jdk-headless")  # fmt: skip
        shutil.rmtree(out, ignore_errors=True)
        done = subprocess.run([javac, "-cp", str(plugin), "-d", str(out), str(GUARD)],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        if done.returncode != 0:
            raise StackError(f"javac could not compile {GUARD}:\n{done.stderr[-2000:]}")
        return out

    def _answers(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
            return True
        except OSError:
            return False


def _one_jar(folder: Path, prefix: str) -> Path:
    found = sorted(folder.glob(f"{prefix}[0-9]*.jar"))
    if len(found) != 1:
        raise StackError(f"{len(found)} jars named {prefix}* in {folder}, not one")
    return found[0]


def stack_spark_connect(state_dir: Path) -> LocalSparkConnect:
    return LocalSparkConnect(state_dir / "spark-connect",
                             int(os.environ.get(PORT_ENV, "15002")))  # fmt: skip
