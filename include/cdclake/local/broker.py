"""Apache Kafka of the local stack: one KRaft node (broker and controller) on loopback,
its data on disk under the state directory, its jars from Maven Central (`stack/kafka`)."""

from __future__ import annotations

import base64
import os
import subprocess
import uuid
from pathlib import Path

from cdclake.exceptions import StackError
from cdclake.local import maven
from cdclake.local.procs import port_free, running, start_daemon, stop_daemon, wait_for

HEAP = "-Xmx768m"
LOG4J = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
"""


def broker_ready(bootstrap: str) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=2)
        return True
    except Exception:
        return False


def java(*args: str) -> list[str]:
    home = os.environ.get("JAVA_HOME")
    return [str(Path(home) / "bin" / "java") if home else "java", *args]


class LocalBroker:
    """A KRaft node: the broker on `port`, its controller on `port + 1`."""

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.controller_port = port + 1
        self.data = root / "data"
        self.pidfile = root / "kafka.pid"
        self.logfile = root / "kafka.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def pid(self) -> int | None:
        return running(self.pidfile)

    def start(self) -> bool:
        """Start the broker unless it runs. True when its storage was formatted now (a
        new cluster: no topic exists), False when it kept its topics or already ran."""
        if self.pid() is not None:
            return False
        for port in (self.port, self.controller_port):
            if not port_free(port):
                raise StackError(f"port {port} is already in use by another process; stop it "
                                 "or choose other ports with CDCLAKE_KAFKA_PORT (Kafka takes "
                                 "that port and the next)")  # fmt: skip
        self.root.mkdir(parents=True, exist_ok=True)
        classpath = maven.classpath("kafka")
        config = self._write_config()
        formatted = not (self.data / "meta.properties").exists()
        if formatted:
            self._format(classpath, config)
        cmd = java(HEAP, "-Djava.awt.headless=true",
                   f"-Dlog4j2.configurationFile={self._write_log4j()}",
                   "-cp", classpath, "kafka.Kafka", str(config))  # fmt: skip
        start_daemon(cmd, self.pidfile, self.logfile)
        wait_for(f"Kafka broker on {self.bootstrap}", self._ready, 90, self.logfile)
        return formatted

    def stop(self) -> bool:
        return stop_daemon(self.pidfile, timeout=30)

    def _ready(self) -> bool:
        if self.pid() is None:
            raise StackError(f"the Kafka broker exited; see {self.logfile}")
        return broker_ready(self.bootstrap)

    def _format(self, classpath: str, config: Path) -> None:
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        cmd = java("-cp", classpath, "kafka.tools.StorageTool", "format", "-t", cluster,
                   "-c", str(config), "--ignore-formatted")  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise StackError(f"formatting Kafka's storage in {self.data} failed: "
                             f"{(done.stdout + done.stderr).strip()[-2000:]}")  # fmt: skip

    def _write_config(self) -> Path:
        host, port, controller = "127.0.0.1", self.port, self.controller_port
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{host}:{controller}",
            "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller}",
            "advertised.listeners": f"PLAINTEXT://{host}:{port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true",
            "log.retention.hours": "-1",  # the local stream is kept until deleted
        }
        path = self.root / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        return path

    def _write_log4j(self) -> Path:
        path = self.root / "log4j2.properties"
        path.write_text(LOG4J.format(level="WARN"))
        return path
