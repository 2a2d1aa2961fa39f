"""Apache Kafka of the local stack: one KRaft node (broker and controller) on loopback,
its data on disk under the state directory, its jars from Maven Central (`stack/kafka`).

Clients authenticate with SASL/PLAIN (SASL_PLAINTEXT on 127.0.0.1) as the user `cdclake`,
whose password is made once and kept in the state directory (readable by its owner only);
`client_config` is what every client of the stack takes. The controller listener (which
only the node itself speaks to) asks for the same login.
"""

from __future__ import annotations

import base64
import os
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path

from cdclake_local import StackError, maven
from cdclake_local.procs import (
    port_free,
    running,
    secret,
    start_daemon,
    stop_daemon,
    wait_started,
    write_private,
)

HEAP = "-Xmx768m"
USER = "cdclake"
PROTOCOL = "SASL_PLAINTEXT"
MECHANISM = "PLAIN"
PLAIN_LOGIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
LOG4J = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
"""


def broker_ready(client_config: Mapping[str, str]) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({**client_config, "log_level": 0}).list_topics(timeout=2)
        return True
    except Exception:
        return False


def jaas(password: str, *users: str) -> str:
    """The JAAS line of a PLAIN login as `cdclake` (and, on the broker, its users)."""
    extra = "".join(f' user_{u}="{password}"' for u in users)
    return f'{PLAIN_LOGIN} required username="{USER}" password="{password}"{extra};'


# the local stack's JVMs (broker, Connect, registry, REST catalog) idle or carry light
# loads: the client compiler alone and the serial collector start them with a quarter less
# CPU and halve what they burn idle (measured: `local up` 21.8 -> 16.2 CPU s, idle 4.5 ->
# 3.0 CPU s a minute); production images keep the JVM's defaults
LOCAL_JVM = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def java(*args: str) -> list[str]:
    home = os.environ.get("JAVA_HOME")
    return [str(Path(home) / "bin" / "java") if home else "java", *LOCAL_JVM, *args]


class LocalBroker:
    """A KRaft node: the broker on `port`, its controller on `port + 1`."""

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.controller_port = port + 1
        self.data = root / "data"
        self.pidfile = root / "kafka.pid"
        self.logfile = root / "kafka.log"
        self.password_file = root / "password"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def password(self) -> str:
        """The SASL password of `cdclake`, made once."""
        return secret(self.password_file)

    def client_config(self) -> dict[str, str]:
        """librdkafka settings of a client of this broker: bootstrap servers and SASL."""
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": PROTOCOL,
            "sasl.mechanism": MECHANISM,
            "sasl.username": USER,
            "sasl.password": self.password(),
        }

    def java_client_config(self) -> dict[str, str]:
        """The SASL settings of a Java client (Kafka Connect, Debezium's signal consumer)."""
        return {
            "security.protocol": PROTOCOL,
            "sasl.mechanism": MECHANISM,
            "sasl.jaas.config": jaas(self.password()),
        }

    def client_env(self) -> dict[str, str]:
        """The variables a pipeline's `kafka` settings read (include/pipelines/demo.yaml)."""
        return {
            "CDCLAKE_KAFKA_BOOTSTRAP": self.bootstrap,
            "CDCLAKE_KAFKA_SECURITY_PROTOCOL": PROTOCOL,
            "CDCLAKE_KAFKA_SASL_MECHANISM": MECHANISM,
            "CDCLAKE_KAFKA_USER": USER,
            "CDCLAKE_KAFKA_PASSWORD": self.password(),
        }

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
        wait_started(f"Kafka broker on {self.bootstrap}", self.pidfile, self.logfile,
                     lambda: broker_ready(self.client_config()), 90)  # fmt: skip
        return formatted

    def stop(self) -> bool:
        return stop_daemon(self.pidfile, timeout=30)

    def _format(self, classpath: str, config: Path) -> None:
        cluster = "-"
        while cluster.startswith("-"):  # as Kafka's Uuid.randomUuid: no leading dash, which
            # the tool's parser would take for an option
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
            "listeners": f"{PROTOCOL}://{host}:{port},CONTROLLER://{host}:{controller}",
            "advertised.listeners": f"{PROTOCOL}://{host}:{port}",
            "controller.listener.names": "CONTROLLER",
            # every listener asks for the login, the controller's too
            "listener.security.protocol.map": f"{PROTOCOL}:{PROTOCOL},CONTROLLER:{PROTOCOL}",
            "inter.broker.listener.name": PROTOCOL,
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            "sasl.mechanism.controller.protocol": MECHANISM,
            f"listener.name.{PROTOCOL.lower()}.plain.sasl.jaas.config": jaas(self.password(), USER),
            "listener.name.controller.plain.sasl.jaas.config": jaas(self.password(), USER),
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
        text = "".join(f"{k}={v}\n" for k, v in settings.items())
        return write_private(self.root / "server.properties", text)  # it holds the password

    def _write_log4j(self) -> Path:
        path = self.root / "log4j2.properties"
        path.write_text(LOG4J.format(level="WARN"))
        return path
