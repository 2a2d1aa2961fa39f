"""Pipeline configuration: frozen dataclasses, built once at the edge from a pipeline file
(`pipeline_file`), and what the rest of cdclake reads."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from fnmatch import fnmatchcase
from pathlib import Path

from cdclake.debezium.formats import WireFormat
from cdclake.debezium.registry import RegistryConfig
from cdclake.exceptions import ConfigError

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class DeleteMode(StrEnum):
    """Hard: deleted rows leave the table. Soft: they stay, with `_cdc_deleted = true`."""

    HARD = "hard"
    SOFT = "soft"


class OnError(StrEnum):
    """What the load does with a record it cannot decode."""

    FAIL = "fail"
    DEAD_LETTER = "dead_letter"


class CatalogType(StrEnum):
    """The Iceberg catalogs a pipeline can load into (Spark's `type` of the catalog)."""

    JDBC = "jdbc"  # tables listed in a database (PostgreSQL)
    REST = "rest"  # an Iceberg REST catalog service


@dataclass(frozen=True)
class TimeoutsConfig:
    """How long cdclake waits on Kafka, the catalog and the source database: `connect_s` to
    reach an endpoint (TCP and handshake), `request_s` for one request's answer. So an
    endpoint that accepts connections but never answers fails the task, naming it."""

    connect_s: float = 10.0
    request_s: float = 30.0


class _ClosedCoordinator(logging.Filter):
    """Drops the line librdkafka writes when a consumer closes while its group
    coordinator's connection is still logging in (SASL): "GroupCoordinator: SASL
    authentication error: ...: Local: Broker transport failure (after 0ms in state DOWN)",
    the connection's teardown, not a failure (confluent-kafka-python issue 1780)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not ("[thrd:GroupCoordinator]" in text and "Broker transport failure" in text
                    and "in state DOWN)" in text)  # fmt: skip


# librdkafka's own lines, as Python log records (of every client `client_config` sets up)
CLIENT_LOG = logging.getLogger("cdclake.kafka.client")
CLIENT_LOG.addFilter(_ClosedCoordinator())


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str
    properties: Mapping[str, str] = field(default_factory=dict)
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)  # the pipeline's
    # the converter the connector writes with: how the reader splits and decodes records
    format: WireFormat = WireFormat.JSON
    # where an Avro format's schemas are (None for JSON)
    schema_registry: RegistryConfig | None = None

    def client_config(self) -> dict[str, object]:
        """librdkafka settings shared by every client cdclake creates; `properties` win,
        but one whose value is empty is left out (`${VAR:-}` with VAR unset: librdkafka's
        default holds, e.g. no SASL login for a broker without authentication). The
        client logs through `CLIENT_LOG`."""
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "logger": CLIENT_LOG,
            # librdkafka's ranges: at least 1 s to set up a connection, 10 ms to answer
            "socket.connection.setup.timeout.ms": str(
                max(1000, int(self.timeouts.connect_s * 1e3))
            ),
            "socket.timeout.ms": str(min(300_000, max(10, int(self.timeouts.request_s * 1e3)))),
            **{k: v for k, v in self.properties.items() if v.strip()},
        }

    @property
    def servers(self) -> str:
        """The bootstrap servers the clients use (`properties` may override the field)."""
        return str(self.client_config()["bootstrap.servers"])


@dataclass(frozen=True)
class CatalogConfig:
    name: str
    type: CatalogType
    uri: str
    warehouse: str
    properties: Mapping[str, str] = field(default_factory=dict)
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)  # the pipeline's


@dataclass(frozen=True)
class TableConfig:
    """One captured source table and where it lands."""

    source: str  # "<schema>.<table>" in PostgreSQL
    target: str  # table name inside the pipeline's namespace
    key: tuple[str, ...] = ()  # overrides the Kafka key columns when set
    exclude: tuple[str, ...] = ()  # source columns never loaded
    delete_mode: DeleteMode = DeleteMode.HARD
    partition_by: tuple[str, ...] = ()  # Iceberg transforms: "bucket(16, id)", "days(ts)"
    properties: Mapping[str, str] = field(default_factory=dict)  # Iceberg table properties

    @property
    def source_schema(self) -> str:
        return self.source.split(".", 1)[0]

    @property
    def source_table(self) -> str:
        return self.source.split(".", 1)[1]


@dataclass(frozen=True)
class SparkConfig:
    conn_id: str = "spark_default"
    master: str = "local[2]"  # used by the CLI; Airflow takes the master from conn_id
    conf: Mapping[str, str] = field(default_factory=dict)


HANDLING_MODES = {
    "decimal_handling_mode": ("precise", "double", "string"),
    "time_precision_mode": ("adaptive", "adaptive_time_microseconds", "connect"),
    "binary_handling_mode": ("bytes", "base64", "base64-url-safe", "hex"),
    "hstore_handling_mode": ("json", "map"),
    "interval_handling_mode": ("numeric", "string"),
}


@dataclass(frozen=True)
class ConnectorModes:
    """The connector's handling modes, as set on it (Debezium's defaults otherwise). The
    load decodes by the Connect schema alone; `compare` needs them to read values back."""

    decimal_handling_mode: str = "precise"
    time_precision_mode: str = "adaptive"
    binary_handling_mode: str = "bytes"
    hstore_handling_mode: str = "json"
    interval_handling_mode: str = "numeric"


@dataclass(frozen=True)
class WatchConfig:
    """Runs when records arrive: the load DAG is scheduled on an Airflow Asset that the
    triggerer watches with the Kafka provider's MessageQueueTrigger, consuming through the
    Airflow connection `conn_id` (its extra: librdkafka settings with a `group.id` of its
    own and `enable.auto.commit` false)."""

    conn_id: str = "cdclake_kafka"


@dataclass(frozen=True)
class SourceConfig:
    """The captured PostgreSQL database and Debezium's signal and notification channels."""

    conn_id: str = "cdclake_source"  # Airflow connection of the source database
    dsn: str | None = None  # libpq connection string for the CLI (password: PGPASSWORD)
    signal_table: str = "public.debezium_signal"
    signal_topic: str | None = None  # Kafka signal channel, when the connector enables it
    notification_topic: str | None = None  # default: <topic_prefix>.debezium_notifications
    # what a snapshot filter may cost the source database, estimated before it is sent
    # (`cdclake_control.snapshot_filter.check_in_source`)
    filter_max_seconds: float = 600.0


@dataclass(frozen=True)
class MaintenanceConfig:
    """Iceberg table maintenance of a pipeline's tables (its
    `cdclake_maintenance__<pipeline>` DAG, on `schedule`).

    Expiry never removes the newest snapshot that carries the committed offsets, whatever
    these settings say (see `cdclake.iceberg.maintenance`).
    """

    enabled: bool = True
    schedule: str | None = "@daily"
    expire_older_than_hours: int = 120  # snapshots older than this are expired ...
    retain_last: int = 10  # ... but at least this many of the newest are kept
    target_file_size_bytes: int = 134_217_728  # data file size compaction aims at
    min_input_files: int = 5  # a file group is rewritten from this many small files on
    delete_file_threshold: int = 2  # a data file with this many delete files is rewritten
    orphan_older_than_hours: int = 72  # unreferenced files younger than this are kept


ORPHAN_MIN_HOURS = 24  # younger files may belong to a commit that is still running


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    path: Path
    topic_prefix: str
    kafka: KafkaConfig
    catalog: CatalogConfig
    namespace: str
    tables: tuple[TableConfig, ...]  # listed by name, plus those `discover` found
    max_records_per_batch: int = 1_000_000
    parallel_tables: int = 4  # tables of one batch loaded at the same time
    schedule: str | None = None
    watch: WatchConfig | None = None  # also run when records arrive
    on_error: OnError = OnError.FAIL
    spark: SparkConfig = field(default_factory=SparkConfig)
    source: SourceConfig = field(default_factory=SourceConfig)
    connector: ConnectorModes = field(default_factory=ConnectorModes)
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)
    # `source` globs ("inventory.*"): every captured table that matches is loaded too
    patterns: tuple[TableConfig, ...] = ()
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)  # kafka, catalog carry it

    @property
    def notification_topic(self) -> str:
        return self.source.notification_topic or f"{self.topic_prefix}.debezium_notifications"

    def table_named(self, name: str) -> TableConfig | None:
        """A table of this pipeline by source (`schema.table`) or target name, or a source
        table a pattern matches."""
        for table in self.tables:
            if name in (table.source, table.target):
                return table
        return self._matched(name)

    def _matched(self, source: str) -> TableConfig | None:
        parts = source.split(".")
        if len(parts) != 2 or not all(IDENTIFIER.match(p) for p in parts):
            return None
        for pattern in self.patterns:
            if all(map(fnmatchcase, parts, pattern.source.split("."))):
                return replace(pattern, source=source, target=parts[1])
        return None

    def with_topics(self, topics: Iterable[str]) -> PipelineConfig:
        """This pipeline with the tables its patterns match among `topics` added (the
        listed tables come first and win) and no patterns left."""
        if not self.patterns:
            return self
        tables = list(self.tables)
        taken = {t.source for t in tables}
        by_target = {t.target: t.source for t in tables}
        head = self.topic_prefix + "."
        for topic in sorted(set(topics)):
            if not topic.startswith(head) or topic[len(head) :] in taken:
                continue
            table = self._matched(topic[len(head) :])
            if table is None:
                continue
            if table.target in by_target:
                raise ConfigError(
                    f"{self.path}: tables {by_target[table.target]} and {table.source} (matched "
                    f"by a pattern) both land in {table.target!r}; list one of them with its "
                    "own target"
                )
            by_target[table.target] = table.source
            taken.add(table.source)
            tables.append(table)
        return replace(self, tables=tuple(tables), patterns=())

    def watched_topics(self) -> list[str]:
        """The topics of the listed tables, and a librdkafka regex (`^...`) for each
        pattern: what a consumer subscribes to to see this pipeline's records."""
        topics = [self.topic_for(t) for t in self.tables]
        for pattern in self.patterns:
            glob = re.escape(self.topic_for(pattern)).replace(r"\*", "[^.]*")
            topics.append("^" + glob.replace(r"\?", "[^.]") + "$")
        return topics

    def topic_for(self, table: TableConfig) -> str:
        return f"{self.topic_prefix}.{table.source}"

    def qualified_target(self, table: TableConfig) -> str:
        """The Spark SQL name of a target table: catalog.namespace.table."""
        return f"{self.catalog.name}.{self.namespace}.{table.target}"
