"""Kafka Connect of the local stack: one distributed worker on loopback running the
Debezium PostgreSQL connector and Apicurio's Avro converter, all from Maven Central
(`stack/connect`, `stack/debezium`, `stack/apicurio-converter`).

The worker keeps connector configurations and source offsets in Kafka topics, so a
restarted stack goes on where it stopped. Its REST API asks for HTTP basic
authentication: the user `cdclake` with a password made once and kept in the state
directory (readable by its owner only). The worker's own clients and its connectors'
producers, consumers and admin clients log in to Kafka with SASL/PLAIN (`LocalBroker`).
Connectors are registered over that API with the configuration docker-compose uses
(`docker/debezium/inventory-connector.json`), only endpoints, names and Kafka logins
changed (`connector_config`); the login of Debezium's Kafka signal consumer is a
reference to a file (`${file:...}`), so the password is not in the stored configuration.
"""

from __future__ import annotations

import base64
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cdclake_local import StackError, maven
from cdclake_local.broker import LocalBroker, java
from cdclake_local.procs import (
    log_tail,
    port_free,
    running,
    secret,
    start_daemon,
    stop_daemon,
    wait_for,
    wait_started,
    write_private,
)

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONNECTOR_JSON = PROJECT_ROOT / "docker" / "debezium" / "inventory-connector.json"
USER = "cdclake"
REQUEST_TIMEOUT_S = 10.0
AUTH_EXTENSION = "org.apache.kafka.connect.rest.basic.auth.extension"
JAAS = """KafkaConnect {{
  {ext}.PropertyFileLoginModule required
  file="{file}";
}};
"""
LOG4J = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.kafka.name = org.apache.kafka
logger.kafka.level = WARN
logger.reflections.name = org.reflections
logger.reflections.level = ERROR
"""


def connector_config(prefix: str, pg_port: int, dbname: str, bootstrap: str,
                     overrides: Mapping[str, str] | None = None,
                     kafka_login: Mapping[str, str] | None = None) -> dict[str, str]:  # fmt: skip
    """docker-compose's connector configuration for a source on 127.0.0.1:`pg_port`,
    topics `<prefix>.*`, slot and publication `cdclake_<prefix>`; `kafka_login` (Java
    client settings) is the login of Debezium's Kafka signal consumer."""
    config = json.loads(CONNECTOR_JSON.read_text())
    config.update({
        "database.hostname": "127.0.0.1",
        "database.port": str(pg_port),
        "database.password": "",  # the local server trusts loopback
        "database.dbname": dbname,
        "topic.prefix": prefix,
        "slot.name": f"cdclake_{prefix}",
        "publication.name": f"cdclake_{prefix}",
        # every table, also those created after the connector started
        "publication.autocreate.mode": "all_tables",
        "signal.kafka.topic": f"{prefix}-signal",
        "signal.kafka.bootstrap.servers": bootstrap,
        "signal.kafka.groupId": f"cdclake-{prefix}-signals",
        "notification.sink.topic.name": f"{prefix}.debezium_notifications",
    })  # fmt: skip
    # notifications (the sink channel) go out through the worker's producer, logged in
    config.update({f"signal.consumer.{k}": v for k, v in (kafka_login or {}).items()})
    config.update(overrides or {})
    return config


class LocalConnect:
    """A Kafka Connect worker with its REST API on 127.0.0.1:`port`."""

    def __init__(self, root: Path, port: int, broker: LocalBroker) -> None:
        self.root, self.port, self.broker = root, port, broker
        self.bootstrap = broker.bootstrap
        self.pidfile = root / "connect.pid"
        self.logfile = root / "connect.log"
        self.password_file = root / "password"
        self.kafka_login_file = root / "kafka-login.properties"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def pid(self) -> int | None:
        return running(self.pidfile)

    def start(self) -> None:
        if self.pid() is not None:
            return
        if not port_free(self.port):
            raise StackError(f"port {self.port} (Kafka Connect's REST API) is already in use "
                             "by another process; stop it or set CDCLAKE_CONNECT_PORT")  # fmt: skip
        self.root.mkdir(parents=True, exist_ok=True)
        plugins = self.root / "plugins"
        plugins.mkdir(exist_ok=True)
        # the connector, and Apicurio's Avro converter for connectors that write Avro
        for name, part in (("debezium-connector-postgres", "debezium"),
                           ("apicurio-converter", "apicurio-converter")):  # fmt: skip
            link = plugins / name
            link.unlink(missing_ok=True)
            link.symlink_to(maven.jars(part), target_is_directory=True)
        cmd = java("-Xmx1g", "-Djava.awt.headless=true",
                   f"-Djava.security.auth.login.config={self._write_jaas()}",
                   f"-Dlog4j2.configurationFile={self._write('log4j2.properties', LOG4J)}",
                   "-cp", maven.classpath("connect"),
                   "org.apache.kafka.connect.cli.ConnectDistributed",
                   str(self._write_worker(plugins)))  # fmt: skip
        start_daemon(cmd, self.pidfile, self.logfile)
        wait_started(f"Kafka Connect on {self.url}", self.pidfile, self.logfile, self._answers,
                     180)  # fmt: skip

    def stop(self) -> bool:
        return stop_daemon(self.pidfile, timeout=30)

    def register(self, name: str, config: Mapping[str, str], timeout: float = 120) -> None:
        """Create or update connector `name`, and wait until it and its task run."""
        self.request("PUT", f"/connectors/{name}/config", dict(config))
        wait_for(f"connector {name} running", lambda: self._running(name), timeout,
                 self.logfile)  # fmt: skip

    def pause(self, name: str, timeout: float = 60) -> None:
        """Stop the connector's task (its configuration and offsets stay), and wait until
        the task is gone: Connect stops it in the background."""
        self.request("PUT", f"/connectors/{name}/stop")
        wait_for(f"connector {name} stopped", lambda: self._stopped(name), timeout,
                 self.logfile)  # fmt: skip

    def delete(self, name: str) -> None:
        self.request("DELETE", f"/connectors/{name}", missing_ok=True)

    def request(self, method: str, path: str, body: Any = None, missing_ok: bool = False):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        token = base64.b64encode(f"{USER}:{self._password()}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as exc:
            if missing_ok and exc.code == 404:
                return None
            detail = exc.read().decode(errors="replace")[:1000]
            raise StackError(f"Kafka Connect {method} {self.url}{path}: HTTP {exc.code}: "
                             f"{detail}") from None  # fmt: skip
        except OSError as exc:
            raise StackError(f"Kafka Connect {method} {self.url}{path}: {exc}") from None
        return json.loads(text) if text.strip() else None

    def _running(self, name: str) -> bool:
        state = self.request("GET", f"/connectors/{name}/status", missing_ok=True)
        if state is None:
            return False
        tasks = state.get("tasks", [])
        failed = [t for t in [state["connector"], *tasks] if t.get("state") == "FAILED"]
        if failed:
            trace = (failed[0].get("trace") or "").strip().splitlines()[:3]
            raise StackError(f"connector {name} failed: {' '.join(trace)}{log_tail(self.logfile)}")
        return state["connector"]["state"] == "RUNNING" and any(
            t.get("state") == "RUNNING" for t in tasks
        )

    def _stopped(self, name: str) -> bool:
        state = self.request("GET", f"/connectors/{name}/status", missing_ok=True)
        return state is None or (state["connector"]["state"] == "STOPPED"
                                 and not state.get("tasks"))  # fmt: skip

    def _answers(self) -> bool:
        try:
            self.request("GET", "/connectors")
            return True
        except StackError:
            return False

    def _password(self) -> str:
        return secret(self.password_file)

    def _write(self, name: str, text: str) -> Path:
        return write_private(self.root / name, text)

    def kafka_login(self) -> dict[str, str]:
        """The Kafka login a connector's own clients take, its JAAS line read from a file
        by the worker (written at start)."""
        login = self.broker.java_client_config()
        jaas = f"${{file:{self.kafka_login_file}:sasl.jaas.config}}"
        return {**login, "sasl.jaas.config": jaas}

    def _write_jaas(self) -> Path:
        users = self._write("users.properties", f"{USER}={self._password()}\n")
        return self._write("jaas.conf", JAAS.format(ext=AUTH_EXTENSION, file=users))

    def _write_worker(self, plugins: Path) -> Path:
        json_converter = "org.apache.kafka.connect.json.JsonConverter"
        login = self.broker.java_client_config()
        self._write(self.kafka_login_file.name, f"sasl.jaas.config={login['sasl.jaas.config']}\n")
        settings = {
            "bootstrap.servers": self.bootstrap,
            # the worker's clients, and those of its source tasks (producer, topic admin)
            # and sink tasks (consumer)
            **login,
            **{f"{p}.{k}": v for p in ("producer", "consumer", "admin") for k, v in login.items()},
            "group.id": "cdclake-connect",
            "key.converter": json_converter,
            "value.converter": json_converter,
            "config.storage.topic": "_connect_configs",
            "offset.storage.topic": "_connect_offsets",
            "status.storage.topic": "_connect_status",
            "config.storage.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            "offset.flush.interval.ms": "1000",
            "listeners": self.url,
            "rest.advertised.host.name": "127.0.0.1",
            "rest.advertised.port": str(self.port),
            "rest.extension.classes": f"{AUTH_EXTENSION}.BasicAuthSecurityRestExtension",
            "plugin.path": str(plugins),
            "plugin.discovery": "hybrid_warn",
            "config.providers": "env,file",
            "config.providers.env.class": (
                "org.apache.kafka.common.config.provider.EnvVarConfigProvider"
            ),
            "config.providers.file.class": (
                "org.apache.kafka.common.config.provider.FileConfigProvider"
            ),
        }
        return self._write("worker.properties", "".join(f"{k}={v}\n" for k, v in settings.items()))
