"""Pipeline files read into `PipelineConfig`: strict keys, every value checked, every error
naming the file and the field, so a broken YAML shows up in the Airflow UI (as a DAG
import error) with enough information to fix it."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from cdclake.config import (
    HANDLING_MODES,
    IDENTIFIER,
    ORPHAN_MIN_HOURS,
    CatalogConfig,
    CatalogType,
    ConnectorModes,
    DeleteMode,
    KafkaConfig,
    MaintenanceConfig,
    OnError,
    PipelineConfig,
    SourceConfig,
    SparkConfig,
    TableConfig,
    TimeoutsConfig,
    WatchConfig,
)
from cdclake.config_reader import SCHEDULE_PRESETS, Reader, load_yaml, schedule_problem
from cdclake.debezium.formats import WireFormat
from cdclake.debezium.registry import RegistryConfig
from cdclake.exceptions import ConfigError

_GLOB = re.compile(r"^[A-Za-z0-9_*?]+$")
# at most 100: Airflow DAG ids (cdclake_maintenance__<name>) have at most 250 characters
_PIPELINE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,99}$")
# what Kafka allows in a topic name; the prefix leaves room for ".<schema>.<table>"
_TOPIC_PREFIX = re.compile(r"^[A-Za-z0-9._-]{1,120}$")


def load_pipeline(path: str | os.PathLike[str]) -> PipelineConfig:
    """Read and validate one pipeline YAML file. Keys are strict: a duplicate key, or one
    the parse functions below do not read, is an error naming it."""
    path = Path(path).resolve()
    reader = Reader(path)
    raw = load_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must be a YAML mapping at the top level")
    pipeline = _parse_pipeline(reader, reader.strict("", raw))
    reader.refuse_unknown()
    return pipeline


def _parse_pipeline(r: Reader, raw: Mapping[str, Any]) -> PipelineConfig:
    name = r.get(raw, "", "name", str)
    if not _PIPELINE_NAME.match(name):
        raise r.fail(
            "name", f"{name!r} must be lower-case letters, digits and underscores (at most 100)"
        )
    topic_prefix = r.get(raw, "", "topic_prefix", str)
    if not _TOPIC_PREFIX.match(topic_prefix) or topic_prefix in (".", ".."):
        raise r.fail(
            "topic_prefix",
            f"{topic_prefix!r} must be 1 to 120 of the characters Kafka allows in a topic name "
            "(letters, digits, '.', '_', '-'), as the connector's topic.prefix",
        )
    timeouts = _parse_timeouts(r, r.mapping(raw, "", "timeouts", required=False))
    kafka_raw = r.mapping(raw, "", "kafka")
    fmt = r.choice(kafka_raw, "kafka", "format", WireFormat, WireFormat.JSON)
    kafka = KafkaConfig(
        bootstrap_servers=r.get(kafka_raw, "kafka", "bootstrap_servers", str),
        properties=r.string_map(kafka_raw, "kafka", "properties"),
        timeouts=timeouts,
        format=fmt,
        schema_registry=_parse_registry(r, kafka_raw, fmt, timeouts),
    )
    catalog = replace(_parse_catalog(r, r.mapping(raw, "", "catalog")), timeouts=timeouts)
    namespace = r.get(raw, "", "namespace", str)
    if not IDENTIFIER.match(namespace):
        raise r.fail("namespace", f"{namespace!r} is not a valid identifier")
    max_records = r.get(raw, "", "max_records_per_batch", int, 1_000_000)
    if max_records <= 0:
        raise r.fail("max_records_per_batch", "must be greater than 0")
    parallel_tables = r.get(raw, "", "parallel_tables", int, 4)
    if parallel_tables <= 0:
        raise r.fail("parallel_tables", "must be greater than 0")
    on_error = r.choice(raw, "", "on_error", OnError, OnError.FAIL)
    spark_raw = r.mapping(raw, "", "spark", required=False)
    if "served" in spark_raw:  # pipeline files written for an older cdclake
        raise r.fail("spark.served", "the served driver was removed; loads run through "
                     "spark-submit (remove this key)")  # fmt: skip
    spark = SparkConfig(
        conn_id=r.get(spark_raw, "spark", "conn_id", str, "spark_default"),
        master=r.get(spark_raw, "spark", "master", str, "local[2]"),
        conf=r.string_map(spark_raw, "spark", "conf"),
    )
    source_raw = r.mapping(raw, "", "source", required=False)
    signal_table = r.get(source_raw, "source", "signal_table", str, "public.debezium_signal")
    _schema_table(r, "source.signal_table", signal_table)
    source = SourceConfig(
        conn_id=r.get(source_raw, "source", "conn_id", str, "cdclake_source"),
        dsn=r.get(source_raw, "source", "dsn", str, None) or None,
        signal_table=signal_table,
        signal_topic=r.get(source_raw, "source", "signal_topic", str, None) or None,
        notification_topic=r.get(source_raw, "source", "notification_topic", str, None) or None,
        filter_max_seconds=_seconds(
            r, source_raw, "source", "filter_max_seconds", SourceConfig.filter_max_seconds
        ),
    )
    tables = _parse_tables(r, raw)
    schedule = _schedule(r, "schedule", r.get(raw, "", "schedule", str, None))
    return PipelineConfig(
        name=name,
        path=r.path,
        topic_prefix=topic_prefix,
        kafka=kafka,
        catalog=catalog,
        namespace=namespace,
        tables=tuple(t for t in tables if not _is_glob(t.source)),
        patterns=tuple(t for t in tables if _is_glob(t.source)),
        max_records_per_batch=max_records,
        parallel_tables=parallel_tables,
        schedule=schedule,
        watch=_parse_watch(r, raw, schedule),
        on_error=on_error,
        spark=spark,
        source=source,
        connector=_parse_connector(r, r.mapping(raw, "", "connector", required=False)),
        maintenance=_parse_maintenance(r, r.mapping(raw, "", "maintenance", required=False)),
        timeouts=timeouts,
    )


def _schedule(r: Reader, where: str, schedule: str | None) -> str | None:
    """`schedule` if Airflow accepts it as a DAG's schedule (null: manual runs only)."""
    problem = None if schedule is None else schedule_problem(schedule)
    if problem is not None:
        raise r.fail(
            where,
            f"{schedule!r} is not a cron expression ('*/5 * * * *') or one of "
            f"{', '.join(SCHEDULE_PRESETS)} or null: {problem}",
        )
    return schedule


def _parse_watch(r: Reader, raw: Mapping[str, Any], schedule: str | None) -> WatchConfig | None:
    """`watch:` (a mapping, `{}` for its defaults), or None when absent."""
    if "watch" not in raw:
        return None
    watch_raw = r.mapping(raw, "", "watch")
    if schedule in ("@once", "@continuous"):
        raise r.fail("watch", f"cannot be combined with schedule {schedule!r}: give a cron "
                     "expression, a periodic preset or no schedule")  # fmt: skip
    return WatchConfig(conn_id=r.get(watch_raw, "watch", "conn_id", str, "cdclake_kafka"))


def _parse_connector(r: Reader, raw: Mapping[str, Any]) -> ConnectorModes:
    """The handling modes, each by its field name or the connector's dotted property name."""
    modes: dict[str, str] = {}
    for name, choices in HANDLING_MODES.items():
        dotted = name.replace("_", ".")
        if name in raw and dotted in raw:
            raise r.fail(f"connector.{dotted}", f"give connector.{name} or {dotted}, not both")
        key = dotted if dotted in raw else name
        value = r.one_of(raw, "connector", key, choices, None)
        if value is not None:
            modes[name] = value
    return ConnectorModes(**modes)


def _parse_timeouts(r: Reader, raw: Mapping[str, Any]) -> TimeoutsConfig:
    seconds = {f.name: _seconds(r, raw, "timeouts", f.name, getattr(TimeoutsConfig, f.name))
               for f in fields(TimeoutsConfig)}  # fmt: skip
    return TimeoutsConfig(**seconds)


def _seconds(r: Reader, raw: Mapping[str, Any], where: str, name: str, default: float) -> float:
    """A setting of `where` that is a number of seconds > 0."""
    value = r.get(raw, where, name, object, default)
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not number > 0 or math.isinf(number):
        raise r.fail(f"{where}.{name}", f"must be a number of seconds > 0, got {value!r}")
    return number


_MAINTENANCE_MINIMUM = {
    "expire_older_than_hours": 0,
    "retain_last": 1,
    "target_file_size_bytes": 1_048_576,
    "min_input_files": 1,
    "delete_file_threshold": 1,
    "orphan_older_than_hours": ORPHAN_MIN_HOURS,
}
_ORPHAN_WHY = " (younger unreferenced files may belong to a load that is still committing)"


def _parse_maintenance(r: Reader, raw: Mapping[str, Any]) -> MaintenanceConfig:
    defaults = MaintenanceConfig()
    enabled = r.get(raw, "maintenance", "enabled", bool, defaults.enabled)
    schedule = r.get(raw, "maintenance", "schedule", str, None)  # present but null: manual
    if "schedule" not in raw:
        schedule = defaults.schedule
    schedule = _schedule(r, "maintenance.schedule", schedule)
    numbers: dict[str, int] = {}
    for name, minimum in _MAINTENANCE_MINIMUM.items():
        value = r.get(raw, "maintenance", name, int, getattr(defaults, name))
        if value < minimum:
            why = _ORPHAN_WHY if name == "orphan_older_than_hours" else ""
            raise r.fail(f"maintenance.{name}", f"must be at least {minimum}, got {value}{why}")
        numbers[name] = value
    return MaintenanceConfig(enabled=enabled, schedule=schedule, **numbers)


def _parse_registry(r: Reader, kafka: Mapping[str, Any], fmt: WireFormat,
                    timeouts: TimeoutsConfig) -> RegistryConfig | None:  # fmt: skip
    """An Avro format's schema registry (`kafka.schema_registry`): none for JSON."""
    raw = r.mapping(kafka, "kafka", "schema_registry", required=False)
    if not fmt.avro:
        if raw:
            raise r.fail("kafka.schema_registry", f"is for the Avro formats, and kafka.format "
                         f"is {fmt.value}")  # fmt: skip
        return None
    if not raw:
        raise r.fail("kafka.schema_registry.url", f"is required with kafka.format {fmt.value}")
    url = r.get(raw, "kafka.schema_registry", "url", str)
    if not url.startswith(("http://", "https://")) or "@" in url.partition("://")[2]:
        raise r.fail("kafka.schema_registry.url", f"{url!r} must be an http(s) URL without "
                     "a login (the login goes in user_info)")  # fmt: skip
    user_info = r.get(raw, "kafka.schema_registry", "user_info", str, "")
    return RegistryConfig(url.rstrip("/"), user_info, timeouts.request_s)


def _parse_catalog(r: Reader, raw: Mapping[str, Any]) -> CatalogConfig:
    name = r.get(raw, "catalog", "name", str)
    if not IDENTIFIER.match(name):
        raise r.fail("catalog.name", f"{name!r} is not a valid identifier")
    kind = r.choice(raw, "catalog", "type", CatalogType)
    warehouse = r.get(raw, "catalog", "warehouse", str)
    if "://" not in warehouse:  # a local path, relative to the config file
        warehouse = (r.path.parent / warehouse).resolve().as_uri()
    return CatalogConfig(
        name=name,
        type=kind,
        uri=r.get(raw, "catalog", "uri", str),
        warehouse=warehouse,
        properties=r.string_map(raw, "catalog", "properties"),
    )


_TRANSFORM = re.compile(
    r"^(?:(?P<column>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<time>years|months|days|hours|year|month|day|hour)"
    r"\((?P<time_column>[A-Za-z_][A-Za-z0-9_]*)\)"
    r"|(?P<sized>bucket|truncate)"
    r"\(\s*(?P<width>\d+)\s*,\s*(?P<sized_column>[A-Za-z_][A-Za-z0-9_]*)\s*\))$"
)


def partition_field(spec: str) -> tuple[str, str]:
    """A `partition_by` entry (`_TRANSFORM`, as the config accepts it) as Iceberg names
    its field's transform and column: "bucket(16, id)" -> ("bucket[16]", "id"),
    "days(ts)" -> ("day", "ts"), "kind" -> ("identity", "kind")."""
    found = _TRANSFORM.match(spec)
    if found is None:
        raise ValueError(f"{spec!r} is not a column or an Iceberg transform")
    if found["column"]:
        return "identity", found["column"]
    if found["time"]:
        return found["time"].removesuffix("s"), found["time_column"]
    return f"{found['sized']}[{found['width']}]", found["sized_column"]


def _names(r: Reader, item: Mapping[str, Any], where: str, key: str) -> list[str]:
    names = r.get(item, where, key, list, [])
    for name in names:
        if not isinstance(name, str) or not IDENTIFIER.match(name):
            raise r.fail(f"{where}.{key}", f"{name!r} is not a column name")
    return names


def _is_glob(source: str) -> bool:
    return "*" in source or "?" in source


def _schema_table(r: Reader, where: str, name: str, glob: bool = False) -> list[str]:
    """The schema and table of `name`, which must be '<schema>.<table>' (with `glob`,
    each part a pattern of * and ?)."""
    parts = name.split(".")
    if len(parts) != 2 or not all((_GLOB if glob else IDENTIFIER).match(p) for p in parts):
        how = " (a pattern may use * and ?)" if glob else ""
        raise r.fail(where, f"{name!r} must be '<schema>.<table>'{how}")
    return parts


def _parse_tables(r: Reader, raw: Mapping[str, Any]) -> tuple[TableConfig, ...]:
    items = r.get(raw, "", "tables", list)
    if not items:
        raise r.fail("tables", "must list at least one table")
    tables: list[TableConfig] = []
    for i, item in enumerate(items):
        where = f"tables[{i}]"
        if isinstance(item, str):
            item = {"source": item}
        if not isinstance(item, dict):
            raise r.fail(where, "must be a string '<schema>.<table>' or a mapping")
        r.strict(where, item)
        source = r.get(item, where, "source", str)
        glob = _is_glob(source)
        parts = _schema_table(r, f"{where}.source", source, glob)
        if glob and "target" in item:
            raise r.fail(f"{where}.target", "a pattern's tables keep their own names; list a "
                         "table by name to rename it")  # fmt: skip
        target = "" if glob else r.get(item, where, "target", str, parts[1])
        if not glob and not target.strip():
            raise r.fail(f"{where}.target", "must not be empty")
        if target and not IDENTIFIER.match(target):
            raise r.fail(f"{where}.target", f"{target!r} is not a valid identifier")
        key = _names(r, item, where, "key")
        exclude = _names(r, item, where, "exclude")
        clash = sorted(set(key) & set(exclude))
        if clash:
            raise r.fail(f"{where}.exclude", f"key column(s) {clash} cannot be excluded")
        delete_mode = r.choice(item, where, "delete_mode", DeleteMode, DeleteMode.HARD)
        partition_by = r.get(item, where, "partition_by", list, [])
        for i_part, spec in enumerate(partition_by):
            if not isinstance(spec, str) or not _TRANSFORM.match(spec):
                raise r.fail(
                    f"{where}.partition_by[{i_part}]",
                    f"{spec!r} is not a column or an Iceberg transform such as "
                    "'bucket(16, id)', 'truncate(4, name)', 'days(ts)'",
                )
        tables.append(
            TableConfig(
                source=source,
                target=target,
                key=tuple(key),
                exclude=tuple(exclude),
                delete_mode=delete_mode,
                partition_by=tuple(partition_by),
                properties=r.string_map(item, where, "properties"),
            )
        )
    seen: dict[str, str] = {}
    for t in tables:
        if _is_glob(t.source):
            continue
        if t.target in seen:
            raise r.fail("tables", f"{seen[t.target]} and {t.source} both land in {t.target!r}")
        seen[t.target] = t.source
    return tuple(tables)
