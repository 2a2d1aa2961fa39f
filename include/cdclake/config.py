"""Pipeline configuration: the frozen dataclasses the rest of cdclake reads, and the rule of
each field. pydantic checks the rules when `pipeline_file` reads a pipeline file into these
classes (every validator here sees a file's values); code that builds them itself is
trusted, as their constructors check nothing."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    AliasGenerator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
    with_config,
)

from cdclake.config_fields import (
    FILE,
    IDENTIFIER,
    Column,
    FieldProblem,
    Identifier,
    OptionalText,
    OrphanHours,
    PipelineName,
    Schedule,
    SchemaTable,
    Seconds,
    Settings,
    SourceTable,
    Text,
    TopicPrefix,
    Transform,
    Whole,
    is_glob,
)
from cdclake.debezium.formats import WireFormat
from cdclake.debezium.registry import RegistryConfig
from cdclake.exceptions import ConfigError


class DeleteMode(StrEnum):
    """Hard: deleted rows leave the table. Soft: they stay, with `_cdc_deleted = true`."""

    HARD = "hard"
    SOFT = "soft"


class OnError(StrEnum):
    """What the load does with a record it cannot decode."""

    FAIL = "fail"
    DEAD_LETTER = "dead_letter"


class OnGap(StrEnum):
    """What the plan does when retention deleted records a table never loaded."""

    FAIL = "fail"
    # re-read the table by an incremental snapshot and remove the rows it does not read
    # (`cdclake_control.gaps`)
    RESNAPSHOT = "resnapshot"


HISTORY_SUFFIX = "_history"  # a table's history (`history: true`) is <target>_history


class Consistency(StrEnum):
    """Where a batch's tables end."""

    NONE = "none"  # each table at its own offsets
    # every table at the same source transaction, tagged (`cdclake_control.consistency`)
    TRANSACTION = "transaction"


class CatalogType(StrEnum):
    """The Iceberg catalogs a pipeline can load into (Spark's `type` of the catalog)."""

    JDBC = "jdbc"  # tables listed in a database (PostgreSQL)
    REST = "rest"  # an Iceberg REST catalog service


@with_config(FILE)
@dataclass(frozen=True)
class TimeoutsConfig:
    """How long cdclake waits on Kafka, the catalog and the source database: `connect_s` to
    reach an endpoint (TCP and handshake), `request_s` for one request's answer. So an
    endpoint that accepts connections but never answers fails the task, naming it."""

    connect_s: Seconds = 10.0
    request_s: Seconds = 30.0


class _ClosedCoordinator(logging.Filter):
    """Drops the line librdkafka writes when a consumer closes while its group
    coordinator's connection is still logging in (SASL): "GroupCoordinator: SASL
    authentication error: ...: Local: Broker transport failure (after 0ms in state DOWN)",
    the connection's teardown, not a failure (confluent-kafka-python issue 1780)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        marks = ("[thrd:GroupCoordinator]", "Broker transport failure", "in state DOWN)")
        return not all(mark in text for mark in marks)


# librdkafka's own lines, as Python log records (of every client `client_config` sets up)
CLIENT_LOG = logging.getLogger("cdclake.kafka.client")
CLIENT_LOG.addFilter(_ClosedCoordinator())


@with_config(FILE)
@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: Text
    properties: Settings = field(default_factory=dict)
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)  # the pipeline's
    # the converter the connector writes with: how the reader splits and decodes records
    format: WireFormat = WireFormat.JSON
    # where an Avro format's schemas are (None for JSON)
    schema_registry: RegistryConfig | None = None

    @model_validator(mode="after")
    def _registry_of_avro(self) -> KafkaConfig:
        """An Avro format's schema registry, at an http(s) URL that carries no login."""
        registry, fmt = self.schema_registry, self.format
        if registry is None and fmt.avro:
            raise FieldProblem("schema_registry.url", f"is required with kafka.format {fmt}")
        if registry is None:
            return self
        if not fmt.avro:
            problem = f"is for the Avro formats, and kafka.format is {fmt}"
            raise FieldProblem("schema_registry", problem)
        url = registry.url
        if not url.startswith(("http://", "https://")) or "@" in url.partition("://")[2]:
            raise FieldProblem(
                "schema_registry.url",
                f"{url!r} must be an http(s) URL without a login (the login goes in user_info)",
            )
        return replace(self, schema_registry=replace(registry, url=url.rstrip("/")))

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


def libpq_settings(timeouts: TimeoutsConfig, limit_statements: bool = True) -> dict[str, str]:
    """The pipeline's timeouts as libpq connection settings: `connect_timeout` (libpq
    counts whole seconds, 2 at least) and a `statement_timeout` the server applies."""
    settings = {"connect_timeout": str(max(2, round(timeouts.connect_s)))}
    if limit_statements:
        settings["options"] = f"-c statement_timeout={int(timeouts.request_s * 1000)}"
    return settings


@with_config(FILE)
@dataclass(frozen=True)
class CatalogConfig:
    name: Identifier
    type: CatalogType
    uri: Text
    warehouse: Text  # a URI; in a file, a path without "://" is relative to the file
    properties: Settings = field(default_factory=dict)
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)  # the pipeline's

    @field_validator("warehouse")
    @classmethod
    def _beside_the_file(cls, warehouse: str, info: ValidationInfo) -> str:
        if "://" in warehouse:
            return warehouse
        context: Any = info.context  # the loader gives the file's path
        return (Path(context["file"]).parent / warehouse).resolve().as_uri()


@with_config(FILE)
@dataclass(frozen=True)
class TableConfig:
    """One captured source table and where it lands."""

    # "<schema>.<table>" in PostgreSQL; a pattern of * and ? makes the table a pattern
    source: SourceTable
    # table name inside the pipeline's namespace ("" for a pattern: its tables keep theirs)
    target: Identifier = ""
    key: tuple[Column, ...] = ()  # overrides the Kafka key columns when set
    exclude: tuple[Column, ...] = ()  # source columns never loaded
    delete_mode: DeleteMode = DeleteMode.HARD
    partition_by: tuple[Transform, ...] = ()  # Iceberg transforms: "bucket(16, id)", "days(ts)"
    properties: Settings = field(default_factory=dict)  # Iceberg table properties
    # keep every version of each row (SCD type 2) in `<target>_history` (HISTORY_SUFFIX)
    history: bool = False
    # the columns whose change opens a version (default all); others are set in place
    history_columns: tuple[Column, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _listed(cls, item: Any) -> Any:
        """A table is listed as its source's name or as a mapping."""
        if isinstance(item, str):
            return {"source": item}
        if not isinstance(item, dict):
            raise ValueError("must be a string '<schema>.<table>' or a mapping")
        if isinstance(item.get("source"), str) and is_glob(item["source"]) and "target" in item:
            problem = "a pattern's tables keep their own names; list a table by name to rename it"
            raise FieldProblem("target", problem)
        return item

    @model_validator(mode="after")
    def _named(self) -> TableConfig:
        """A key column is never excluded; the target defaults to the source's table name."""
        clash = sorted(set(self.key) & set(self.exclude))
        if clash:
            raise FieldProblem("exclude", f"key column(s) {clash} cannot be excluded")
        if self.history_columns and not self.history:
            raise FieldProblem("history_columns", "needs history: true")
        gone = sorted(set(self.history_columns) & set(self.exclude))
        if gone:
            raise FieldProblem("history_columns", f"column(s) {gone} are excluded")
        if self.target or is_glob(self.source):
            return self
        return replace(self, target=self.source_table)

    @property
    def source_schema(self) -> str:
        return self.source.split(".", 1)[0]

    @property
    def source_table(self) -> str:
        return self.source.split(".", 1)[1]


@with_config(FILE)
@dataclass(frozen=True)
class SparkConfig:
    conn_id: str = "spark_default"
    master: str = "local[2]"  # used by the CLI; Airflow takes the master from conn_id
    # an Airflow `spark_connect` connection: the DAGs' loads run on that Spark Connect
    # server instead of spark-submit (`cdclake.spark.connect_session`)
    connect_conn_id: str = ""
    conf: Settings = field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _not_served(cls, section: Any) -> Any:
        if isinstance(section, dict) and "served" in section:  # a file of an older cdclake
            problem = "the served driver was removed; loads run through spark-submit"
            raise FieldProblem("served", problem + " (remove this key)")
        return section


# a handling mode is also read by the connector's own name of it: binary.handling.mode
_DOTTED = AliasGenerator(validation_alias=lambda name: AliasChoices(name, name.replace("_", ".")))


@with_config({**FILE, "alias_generator": _DOTTED})
@dataclass(frozen=True)
class ConnectorModes:
    """The connector's handling modes, as set on it (Debezium's defaults otherwise). The
    load decodes by the Connect schema alone; `compare` needs them to read values back."""

    decimal_handling_mode: Literal["precise", "double", "string"] = "precise"
    time_precision_mode: Literal["adaptive", "adaptive_time_microseconds", "connect"] = "adaptive"
    binary_handling_mode: Literal["bytes", "base64", "base64-url-safe", "hex"] = "bytes"
    hstore_handling_mode: Literal["json", "map"] = "json"
    interval_handling_mode: Literal["numeric", "string"] = "numeric"

    @model_validator(mode="before")
    @classmethod
    def _one_spelling(cls, section: Any) -> Any:
        for name in (f.name for f in fields(cls) if isinstance(section, dict)):
            dotted = name.replace("_", ".")
            if name in section and dotted in section:
                raise FieldProblem(dotted, f"give connector.{name} or {dotted}, not both")
        return section


@with_config(FILE)
@dataclass(frozen=True)
class WatchConfig:
    """Runs when records arrive: the load DAG is scheduled on an Airflow Asset that the
    triggerer watches with the Kafka provider's MessageQueueTrigger, consuming through the
    Airflow connection `conn_id` (its extra: librdkafka settings with a `group.id` of its
    own and `enable.auto.commit` false)."""

    conn_id: str = "cdclake_kafka"


@with_config(FILE)
@dataclass(frozen=True)
class SourceConfig:
    """The captured PostgreSQL database and Debezium's signal and notification channels."""

    conn_id: str = "cdclake_source"  # Airflow connection of the source database
    dsn: OptionalText = None  # libpq connection string for the CLI (password: PGPASSWORD)
    signal_table: SchemaTable = "public.debezium_signal"
    signal_topic: OptionalText = None  # Kafka signal channel, when the connector enables it
    notification_topic: OptionalText = None  # default: <topic_prefix>.debezium_notifications
    transaction_topic: OptionalText = None  # default: <topic_prefix>.transaction
    # what a snapshot filter may cost the source database, estimated before it is sent
    # (`cdclake_control.snapshot_filter.check_in_source`)
    filter_max_seconds: Seconds = 600.0


@with_config(FILE)
@dataclass(frozen=True)
class MaintenanceConfig:
    """Iceberg table maintenance of a pipeline's tables (its
    `cdclake_maintenance__<pipeline>` DAG, on `schedule`; None: manual runs only).

    Expiry never removes the newest snapshot that carries the committed offsets, whatever
    these settings say (see `cdclake.iceberg.maintenance`).
    """

    enabled: bool = True
    schedule: Schedule = "@daily"
    expire_older_than_hours: Annotated[Whole, Field(ge=0)] = 120  # older snapshots expire ...
    retain_last: Annotated[Whole, Field(ge=1)] = 10  # ... but at least this many are kept
    # the data file size compaction aims at
    target_file_size_bytes: Annotated[Whole, Field(ge=1_048_576)] = 134_217_728
    # a file group is rewritten from this many small files on
    min_input_files: Annotated[Whole, Field(ge=1)] = 5
    delete_file_threshold: Annotated[Whole, Field(ge=1)] = 2  # delete files that rewrite a file
    orphan_older_than_hours: OrphanHours = 72  # younger unreferenced files are kept


@with_config(FILE)
@dataclass(frozen=True)
class PipelineConfig:
    name: PipelineName
    path: Path
    topic_prefix: TopicPrefix
    kafka: KafkaConfig
    catalog: CatalogConfig
    namespace: Identifier
    # listed by name, plus those `discover` found
    tables: Annotated[tuple[TableConfig, ...], Field(min_length=1)]
    max_records_per_batch: Annotated[Whole, Field(gt=0)] = 1_000_000
    parallel_tables: Annotated[Whole, Field(gt=0)] = 4  # tables of one batch loaded at once
    schedule: Schedule = None
    watch: WatchConfig | None = None  # also run when records arrive
    on_error: OnError = OnError.FAIL
    on_gap: OnGap = OnGap.FAIL
    consistency: Consistency = Consistency.NONE
    # how long the tag of each consistent batch is kept (the moving one stays)
    consistent_tags_hours: Annotated[Whole, Field(ge=1)] = 24
    spark: SparkConfig = field(default_factory=SparkConfig)
    source: SourceConfig = field(default_factory=SourceConfig)
    connector: ConnectorModes = field(default_factory=ConnectorModes)
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)
    # `source` globs ("inventory.*"): every captured table that matches is loaded too
    patterns: tuple[TableConfig, ...] = ()
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)  # kafka, catalog carry it

    @model_validator(mode="after")
    def _as_a_whole(self) -> PipelineConfig:
        """What a file's sections say together: its `tables` are the tables it names and
        the patterns; two tables never land in one target; `watch` needs a schedule that
        repeats (or none); the Kafka clients and the catalog wait `timeouts`."""
        if self.watch is not None and self.schedule in ("@once", "@continuous"):
            raise FieldProblem(
                "watch",
                f"cannot be combined with schedule {self.schedule!r}: give a cron expression, "
                "a periodic preset or no schedule",
            )
        if self.consistency is Consistency.TRANSACTION and self.kafka.format.flat:
            raise FieldProblem(
                "consistency",
                "transaction needs each change's transaction, which flattened records "
                f"({self.kafka.format.value}) do not carry: use the whole envelope",
            )
        tables = tuple(t for t in self.tables if not is_glob(t.source))
        seen: dict[str, str] = {}
        for t in tables:
            names = [t.target, *([t.target + HISTORY_SUFFIX] if t.history else [])]
            for name in names:
                if name in seen:
                    problem = f"{seen[name]} and {t.source} both land in {name!r}"
                    raise FieldProblem("tables", problem)
                seen[name] = t.source
        registry = self.kafka.schema_registry
        if registry is not None:
            registry = replace(registry, timeout_s=self.timeouts.request_s)
        return replace(
            self,
            tables=tables,
            patterns=tuple(t for t in self.tables if is_glob(t.source)),
            kafka=replace(self.kafka, timeouts=self.timeouts, schema_registry=registry),
            catalog=replace(self.catalog, timeouts=self.timeouts),
        )

    @property
    def transaction_topic(self) -> str:
        return self.source.transaction_topic or f"{self.topic_prefix}.transaction"

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
