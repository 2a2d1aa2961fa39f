"""`cdclake local up | down | status`: the whole local stack under one state directory."""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import signal
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
from cdclake.spark import REMOTE_ENV, remote_url

from cdclake_local import StackError, maven, rest_catalog, spark_connect
from cdclake_local.airflow_home import airflow_env, connections, setup_airflow_home
from cdclake_local.airflow_server import stop_airflow
from cdclake_local.broker import MECHANISM, PROTOCOL, USER, LocalBroker
from cdclake_local.connect import LocalConnect, connector_config
from cdclake_local.postgres import LocalPostgres
from cdclake_local.procs import log_tail, wait_for
from cdclake_local.registry import stack_registry

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
REGISTRY_ENV = "CDCLAKE_REGISTRY"  # 1: `up` starts the schema registry too
SPARK_CONNECT_CONN = "cdclake_spark_connect"  # the stack's server, for `spark.connect_conn_id`


@dataclass(frozen=True)
class StackSettings:
    state_dir: Path
    project_root: Path = PROJECT_ROOT
    pg_port: int = 55432
    kafka_port: int = 19092  # and the next one, Kafka's controller
    connect_port: int = 19094
    topic_prefix: str = "demo"
    source_db: str = "inventory"
    catalog_db: str = "cdclake_catalog"
    catalog_name: str = "lake"

    @classmethod
    def from_env(cls) -> StackSettings:
        kafka = int(os.environ.get("CDCLAKE_KAFKA_PORT", "19092"))
        return cls(
            # absolute: PostgreSQL is started with its own working directory
            state_dir=Path(
                os.environ.get("CDCLAKE_STATE_DIR", PROJECT_ROOT / ".cdclake")
            ).absolute(),
            pg_port=int(os.environ.get("CDCLAKE_PG_PORT", "55432")),
            kafka_port=kafka,
            connect_port=int(os.environ.get("CDCLAKE_CONNECT_PORT", kafka + 2)),
        )

    @property
    def slot_name(self) -> str:
        return f"cdclake_{self.topic_prefix}"

    @property
    def notification_topic(self) -> str:
        return f"{self.topic_prefix}.debezium_notifications"

    @property
    def signal_topic(self) -> str:
        return f"{self.topic_prefix}-signal"  # Debezium's default for the Kafka channel

    @property
    def message_topic(self) -> str:
        return f"{self.topic_prefix}.message"


class LocalStack:
    def __init__(self, settings: StackSettings) -> None:
        self.s = settings
        root = settings.state_dir
        self.postgres = LocalPostgres(root / "postgres", settings.pg_port)
        self.broker = LocalBroker(root / "kafka", settings.kafka_port)
        self.connect = LocalConnect(root / "connect", settings.connect_port, self.broker)
        self.capture_log = self.connect.logfile
        self.warehouse = root / "warehouse"
        self.airflow_home = root / "airflow"

    # ---- endpoints -------------------------------------------------------------------
    @property
    def source_dsn(self) -> str:
        return self.postgres.dsn_for(self.s.source_db)

    @property
    def catalog_uri(self) -> str:
        return f"jdbc:postgresql://127.0.0.1:{self.s.pg_port}/{self.s.catalog_db}"

    @property
    def spark_jars(self) -> Path:
        """The jars loads add to Spark (stack/spark/pom.xml; CDCLAKE_SPARK_JARS)."""
        return maven.jars("spark")

    def status(self) -> dict[str, Any]:
        pg_port, db = self.s.pg_port, self.s.catalog_db
        return {
            "state_dir": str(self.s.state_dir),
            "spark_jars": str(self.spark_jars),
            "postgres": {
                "running": self.postgres.running(),
                "pid": self.postgres.pid(),
                "dsn": self.postgres.dsn,
                "source_dsn": self.source_dsn,
            },
            "kafka": {
                "running": self.broker.pid() is not None,
                "pid": self.broker.pid(),
                "bootstrap": self.broker.bootstrap,
                "security_protocol": PROTOCOL,
                "sasl_mechanism": MECHANISM,
                "user": USER,
                "password_file": str(self.broker.password_file),  # never the password
            },
            "capture": {
                "running": self.connect.pid() is not None,
                "pid": self.connect.pid(),
                "connect_url": self.connect.url,
                "connector": self.s.topic_prefix,
                "topic_prefix": self.s.topic_prefix,
                "slot": self.s.slot_name,
                "notification_topic": self.s.notification_topic,
                "signal_topic": self.s.signal_topic,
                "log": str(self.capture_log),
            },
            "catalog": {
                "name": self.s.catalog_name,
                "type": "jdbc",
                "uri": self.catalog_uri,
                "sqlalchemy_uri": f"postgresql+psycopg://postgres@127.0.0.1:{pg_port}/{db}",
                "warehouse": self.warehouse.resolve().as_uri(),
            },
            "airflow": {
                "home": str(self.airflow_home),
                "dags_folder": str(self.s.project_root / "dags"),
                "db": f"sqlite:///{self.airflow_home}/airflow.db",
            },
        }

    # ---- up / down -------------------------------------------------------------------
    def up(self) -> dict[str, Any]:
        self.s.state_dir.mkdir(parents=True, exist_ok=True)
        self.postgres.start()
        self._seed_source()
        self.postgres.ensure_database(self.s.catalog_db)
        if self.broker.start():
            # a new Kafka cluster (its storage formatted now): the stream is new, so what
            # was derived from an earlier one starts over (the source database is kept)
            self._reset_stream_state()
        self.connect.start()
        self._register(self.s.topic_prefix)
        self.warehouse.mkdir(parents=True, exist_ok=True)
        conns = connections(self.s.pg_port, self.broker.client_config(), self.s.source_db)
        server = spark_connect.stack_spark_connect(self.s.state_dir)
        if spark_connect.enabled():  # CDCLAKE_SPARK_CONNECT=1: loads skip a JVM's start
            server.start()
            conns[SPARK_CONNECT_CONN] = server.airflow_connection()
        setup_airflow_home(self.s.project_root, self.airflow_home, conns)
        status = self.status()
        if server.pid() is not None:
            status["spark_connect"] = {"port": server.port, "pid": server.pid(),
                                       "token_file": str(server.token_file),
                                       "airflow_connection": SPARK_CONNECT_CONN}  # fmt: skip
        if rest_catalog.enabled():  # CDCLAKE_REST_CATALOG=1: the S3 store and REST catalog
            rest = rest_catalog.stack_rest_catalog(self.s.state_dir)
            rest.start()
            status["rest_catalog"] = {"uri": rest.uri, "warehouse": rest.warehouse,
                                      "s3_endpoint": rest.store.endpoint}  # fmt: skip
        if os.environ.get(REGISTRY_ENV, "").strip() == "1":  # for connectors writing Avro
            registry = stack_registry(self.s.state_dir)
            registry.start()
            converter = registry.converter_config("value")
            status["schema_registry"] = {"url": registry.url, "converter": converter}
        (self.s.state_dir / "stack.json").write_text(json.dumps(status, indent=2))
        return status

    def down(self) -> dict[str, bool]:
        stopped = {
            "airflow": stop_airflow(self.airflow_home) > 0,
            "capture": self.connect.stop(),
            "kafka": self.broker.stop(),
            "postgres": self.postgres.stop(),
            **rest_catalog.stop_stack_rest_catalog(self.s.state_dir),
            "schema_registry": stack_registry(self.s.state_dir).stop(),
            "spark_connect": spark_connect.stack_spark_connect(self.s.state_dir).stop(),
        }
        return stopped

    def env(self) -> dict[str, str]:
        """Variables a shell needs to use this stack's Airflow and endpoints."""
        base = airflow_env(self.airflow_home)
        return {
            "AIRFLOW_HOME": base["AIRFLOW_HOME"],
            "CDCLAKE_STATE_DIR": str(self.s.state_dir),
            **self.broker.client_env(),  # bootstrap and SASL login
            "CDCLAKE_SOURCE_DSN": self.source_dsn,
            # the demo pipeline's catalog: its defaults name the default stack's
            "CDCLAKE_CATALOG_URI": self.catalog_uri,
            "CDCLAKE_WAREHOUSE": self.warehouse.resolve().as_uri(),
            "CDCLAKE_SPARK_JARS": str(self.spark_jars),
        }

    def env_exports(self) -> list[str]:
        """`env` as shell exports; the Kafka password is read from its file by the shell,
        never printed."""
        secret = {"CDCLAKE_KAFKA_PASSWORD": self.broker.password_file}
        exports = [
            f'export {k}="$(cat {shlex.quote(str(secret[k]))})"' if k in secret
            else f"export {k}={v}"
            for k, v in self.env().items()
        ]  # fmt: skip
        server = spark_connect.stack_spark_connect(self.s.state_dir)
        if server.pid() is not None:  # loads of the CLI through the stack's server
            token = f"$(cat {shlex.quote(str(server.token_file))})"
            url = remote_url("127.0.0.1", server.port, token)
            exports.append(f'export {REMOTE_ENV}="{url}"')
        return exports

    # ---- parts -----------------------------------------------------------------------
    def _seed_source(self) -> None:
        """Seed the demo tables into a source database that holds no table yet: never
        again into one that exists (its rows are the user's now: deleted rows stay
        deleted). The seed commits whole or not at all, so a seed cut short runs again."""
        self.postgres.ensure_database(self.s.source_db)
        with psycopg.connect(self.source_dsn) as conn, conn.transaction():
            if conn.execute(
                "select 1 from pg_class c join pg_namespace n on n.oid = c.relnamespace "
                "where c.relkind in ('r', 'p') "
                "and n.nspname not in ('pg_catalog', 'information_schema') limit 1"
            ).fetchone():
                log.info("%s already holds tables; not seeded", self.s.source_db)
                return
            names = ["inventory.sql", "type_zoo.sql"]
            if conn.execute(
                "select 1 from pg_available_extensions where name = 'postgis'"
            ).fetchone():
                names.append("geo_zoo.sql")  # PostGIS types, when the extension is installed
            for name in names:
                conn.execute(resources.files("cdclake").joinpath(f"sql/{name}").read_text())

    def _reset_stream_state(self) -> None:
        with psycopg.connect(self.source_dsn, autocommit=True) as conn:
            row = conn.execute(
                "select active_pid from pg_replication_slots where slot_name = %s",
                (self.s.slot_name,),
            ).fetchone()
            if row is not None:
                if row[0]:
                    conn.execute("select pg_terminate_backend(%s)", (row[0],))
                    time.sleep(1)
                conn.execute("select pg_drop_replication_slot(%s)", (self.s.slot_name,))
        with psycopg.connect(self.postgres.dsn, autocommit=True) as conn:
            conn.execute(f'drop database if exists "{self.s.catalog_db}" with (force)')
            conn.execute(f'create database "{self.s.catalog_db}"')
        shutil.rmtree(self.warehouse, ignore_errors=True)
        log.info("a new Kafka cluster: the replication slot and the lake were reset")

    def restart_capture(self, kill: bool = False) -> None:
        """Stop Kafka Connect (SIGKILL when `kill`: what it had not committed is sent
        again), start it and wait until the connector streams."""
        if kill and (pid := self.connect.pid()) is not None:
            os.killpg(pid, signal.SIGKILL)
        self.connect.stop()
        self.connect.start()
        self._register(self.s.topic_prefix)

    def start_capture(self, prefix: str, overrides: Mapping[str, str] | None = None) -> str:
        """Another connector on the same source with its own slot, offsets and topics
        (`<prefix>.*`), e.g. with other handling modes. Returns its name; remove it with
        `stop_capture`, which also drops its replication slot."""
        self._register(prefix, overrides)
        return prefix

    def stop_capture(self, name: str) -> None:
        self.connect.delete(name)
        slot = f"cdclake_{name}"

        def dropped() -> bool:
            with psycopg.connect(self.source_dsn, autocommit=True) as conn:
                row = conn.execute("select active from pg_replication_slots where slot_name = %s",
                                   (slot,)).fetchone()  # fmt: skip
                if row is not None and not row[0]:
                    conn.execute("select pg_drop_replication_slot(%s)", (slot,))
            return row is None or not row[0]

        wait_for(f"replication slot {slot} released", dropped, 60)

    def _register(self, prefix: str, overrides: Mapping[str, str] | None = None) -> None:
        config = connector_config(prefix, self.s.pg_port, self.s.source_db,
                                  self.broker.bootstrap, overrides,
                                  self.connect.kafka_login())  # fmt: skip
        self.connect.register(prefix, config)

        def ready() -> bool:
            with psycopg.connect(self.source_dsn, autocommit=True) as conn:
                row = conn.execute(
                    "select active from pg_replication_slots where slot_name = %s",
                    (f"cdclake_{prefix}",),
                ).fetchone()
            return bool(row and row[0])

        wait_for(f"connector {prefix} (replication slot active)", ready, 180, self.capture_log)

    def wait_for_capture(self, timeout: float = 120.0, prefix: str | None = None) -> None:
        """Block until every change committed so far in the source is in Kafka.

        Writes a transactional logical-decoding message and waits for it on the
        connector's message topic: everything committed before it was sent before it,
        and is in Kafka once the slot confirms the message's LSN.
        A capture working through a backlog may take longer than `timeout`: the wait
        fails once the connector has read no WAL for `timeout` seconds, or after ten
        times `timeout` in all.
        """
        from confluent_kafka import Consumer, TopicPartition

        marker = uuid.uuid4().hex
        topic = f"{prefix}.message" if prefix else self.s.message_topic
        slot = f"cdclake_{prefix}" if prefix else self.s.slot_name
        logfile = self.capture_log
        with psycopg.connect(self.source_dsn, autocommit=True) as conn:
            (marker_lsn,) = conn.execute(
                "select pg_logical_emit_message(true, 'cdclake.sync', %s)::text", (marker,)
            ).fetchone()
        consumer = Consumer(
            {
                **self.broker.client_config(),
                "group.id": f"cdclake-sync-{marker}",
                "enable.auto.commit": False,
            }
        )
        position = self._slot_position(slot)
        moved = time.monotonic()
        give_up = moved + 10 * timeout
        try:
            while True:
                md = consumer.list_topics(timeout=5).topics.get(topic)
                if md is not None and not md.error:
                    break
                if time.monotonic() - moved > timeout:
                    raise StackError(f"topic {topic} never appeared")
                time.sleep(0.5)
            consumer.assign([TopicPartition(topic, p, 0) for p in md.partitions])
            checked = time.monotonic()
            while True:
                msg = consumer.poll(1.0)
                if msg is not None and not msg.error() and msg.value() is not None:
                    if any(form in msg.value() for form in _encodings(marker)):
                        # records of other topics may still be on their way: all are in
                        # Kafka once Connect committed the marker's offset (it commits
                        # acknowledged records only) and Debezium confirmed it to the slot
                        confirmed = partial(self._confirmed, slot, marker_lsn)
                        wait_for(f"slot {slot} confirming the sync marker (WAL {marker_lsn})",
                                 confirmed, timeout, logfile)  # fmt: skip
                        return
                    continue
                now = time.monotonic()
                if now - checked < 5:
                    continue
                checked, seen = now, self._slot_position(slot)
                if seen != position:
                    position, moved = seen, now
                elif now - moved > timeout or now > give_up:
                    stalled = f"read no WAL for {timeout:.0f}s" if now <= give_up else "is slow"
                    raise StackError(
                        f"capture did not deliver the sync marker (WAL {marker_lsn}): slot "
                        f"{slot} {stalled} (sent up to {position[1]}, confirmed "
                        f"{position[0]}); see {logfile}{log_tail(logfile)}"
                    )
        finally:
            consumer.close()

    def _confirmed(self, slot: str, lsn: str) -> bool:
        with psycopg.connect(self.source_dsn, autocommit=True) as conn:
            row = conn.execute("select confirmed_flush_lsn >= %s::pg_lsn from pg_replication_slots "
                               "where slot_name = %s", (lsn, slot)).fetchone()  # fmt: skip
        return bool(row and row[0])

    def _slot_position(self, slot: str) -> tuple[str | None, str | None]:
        """The slot's confirmed flush LSN and how far its walsender has sent WAL."""
        with psycopg.connect(self.source_dsn, autocommit=True) as conn:
            row = conn.execute(
                "select s.confirmed_flush_lsn::text, r.sent_lsn::text "
                "from pg_replication_slots s left join pg_stat_replication r "
                "on r.pid = s.active_pid where s.slot_name = %s",
                (slot,),
            ).fetchone()
        return (row[0], row[1]) if row else (None, None)


def _encodings(text: str) -> tuple[bytes, ...]:
    """The marker as each binary.handling.mode sends a message's content."""
    import base64

    raw = text.encode()
    return (
        raw,
        base64.b64encode(raw),
        base64.urlsafe_b64encode(raw).rstrip(b"="),
        raw.hex().encode(),
    )


def command(args) -> int:
    """`cdclake local <action>`."""
    stack = LocalStack(StackSettings.from_env())
    if args.action == "up":
        print(json.dumps(stack.up(), indent=2))
    elif args.action == "down":
        print(json.dumps(stack.down(), indent=2))
    elif args.action == "status":
        status = stack.status()
        if args.json:
            print(json.dumps(status, indent=2))
        else:
            for name in ("postgres", "kafka", "capture"):
                part = status[name]
                state = f"running (pid {part['pid']})" if part["running"] else "stopped"
                print(f"{name:10} {state}")
            print(f"{'catalog':10} {status['catalog']['uri']}  {status['catalog']['warehouse']}")
            print(f"{'airflow':10} AIRFLOW_HOME={status['airflow']['home']}")
    elif args.action == "env":
        print("\n".join(stack.env_exports()))
    elif args.action == "wait":
        stack.wait_for_capture()
    return 0
