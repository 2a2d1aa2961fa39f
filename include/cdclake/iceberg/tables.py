"""Load: create or evolve the Iceberg table, MERGE the resolved changes, and put the
consumed offsets into the same Iceberg commit's snapshot summary."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdclake.config_fields import partition_field
from cdclake.debezium.schema import DELETED, METADATA_COLUMNS, TopicSchema, widens
from cdclake.exceptions import CommitConflictError, ConfigError, DecodeError
from cdclake.iceberg.catalog import lake_table, summaries, summary_of
from cdclake.iceberg.merge_sql import (
    PIPELINE_PROPERTIES,
    RESERVED_PROPERTIES,
    TABLE_PROPERTIES,
    _properties_sql,
    _sql_text,
    build_create_sql,
    pipeline_properties_value,
    quote,
)
from cdclake.iceberg.snapshots import (
    committed_from_snapshots,
    expired_ancestor_error,
    offsets_in,
    offsets_summary,
)
from cdclake.offsets import SUMMARY_HEAL, SUMMARY_TRUNCATE, TopicPartition

if TYPE_CHECKING:
    from pyiceberg.table import Table as LakeTable
    from pyspark.sql import DataFrame, SparkSession

# a py4j proxy of a JVM object (an Iceberg `Table`, Spark actions): untyped
JvmObject = Any

log = logging.getLogger(__name__)

# What Iceberg raises when another writer got to a table first (creating, evolving or
# committing to it).
ICEBERG_CONFLICTS = (
    "ValidationException",
    "CommitFailedException",
    "Found conflicting files",
    "AlreadyExistsException",
)
DEAD_LETTERS = "_cdclake_dead_letters"  # the namespace's dead-letter table
# A load commits to a branch of its own made at the snapshot its offsets were read from
# (`iceberg/write.py`); main then takes the branch by a fast-forward, which Iceberg refuses
# once another commit reached main since: offsets never move backwards, whatever else runs.
# Two metadata commits per table and batch (the branch; the fast-forward with the branch's
# removal): 30 and 45 ms each measured on local disk.
STAGE_PREFIX = "cdclake_load_"


def stage_branches(ice: JvmObject) -> dict[str, int]:
    """The branches loads made on the JVM Iceberg table `ice` (`STAGE_PREFIX`), each with
    the time (ms) it was made: the one in its name, else (older versions' names) the time
    of the snapshot it stands at."""
    refs = ice.refs()  # a py4j map
    made = {}
    for name in (str(r) for r in refs.keySet() if str(r).startswith(STAGE_PREFIX)):
        stamp = re.match(r"(\d{13})_", name[len(STAGE_PREFIX) :])
        if stamp:
            made[name] = int(stamp.group(1))
        else:
            made[name] = int(ice.snapshot(refs.get(name).snapshotId()).timestampMillis())
    return made


# table property: the LSN of the last truncate loaded, set by older versions (loads now
# carry it in their commit's summary, `SUMMARY_TRUNCATE`)
TRUNCATED_BELOW = "cdclake.truncated-below-lsn"


@contextmanager
def conflicts_reported(message: str, names: Sequence[str] = ICEBERG_CONFLICTS) -> Iterator[None]:
    """Turn Iceberg's refusal of a commit (another writer was first) into a
    CommitConflictError saying `message`; every other error passes unchanged."""
    try:
        yield
    except Exception as exc:
        if any(name in str(exc) for name in names):
            raise CommitConflictError(message) from exc
        raise


def append_to_empty(spark: SparkSession, table: str, query: str, snapshot_id: int | None) -> None:
    """Write `query`'s rows into `table`, which held no row at `snapshot_id` (None: no
    snapshot yet), in one commit that fails if any other commit has added rows since.

    The same outcome as the MERGE into the empty table, without its join: an overwrite
    that deletes nothing (`false`) with serializable isolation. Iceberg then checks every
    data file committed after `snapshot_id` (or ever, without one) against an always-true
    filter, so a concurrent writer makes the commit fail (ValidationException) instead of
    both rows standing."""
    from pyspark.sql import functions as F

    writer = spark.sql(query).writeTo(table).option("isolation-level", "serializable")
    if snapshot_id is not None:
        writer = writer.option("validate-from-snapshot-id", str(snapshot_id))
    writer.overwrite(F.lit(False))


def table_columns(spark: SparkSession, table: str) -> dict[str, str]:
    """Column name -> Spark type (simple string) of an existing table."""
    return {f.name: f.dataType.simpleString() for f in spark.table(table).schema.fields}


def ensure_namespace(spark: SparkSession, namespace: str) -> None:
    """CREATE NAMESPACE IF NOT EXISTS, also when another run creates it at the same moment
    (the JDBC catalog then fails on its unique key although the namespace now exists)."""
    try:
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {namespace}")
    except Exception:
        if not _namespace_exists(spark, namespace):
            raise
        log.info("%s: created by another run at the same time", namespace)


def _namespace_exists(spark: SparkSession, namespace: str) -> bool:
    try:
        spark.sql(f"DESCRIBE NAMESPACE {namespace}").collect()
    except Exception:
        return False
    return True


def _create(spark: SparkSession, table: str, create_sql: str, of: str | None = None) -> None:
    """Run a CREATE TABLE; when it fails because another run created the table at the
    same moment, fail this run's batch as a conflict (nothing of it is written). The
    JDBC catalog reports such a loss as an unknown SQL failure (PostgreSQL's unique
    violation), Spark as TABLE_OR_VIEW_ALREADY_EXISTS."""
    try:
        spark.sql(create_sql)
    except Exception as exc:
        if not spark.catalog.tableExists(table):
            raise
        raise CommitConflictError(
            f"{of or table}: another run created {table if of else 'this table'} at the same "
            "time; this run's batch was not committed to it. Plan again."
        ) from exc


def _follow_key(spark: SparkSession, table: str, key_names: Sequence[str]) -> None:
    """Keep the table's identifier fields on the batch's key: set them when a run
    stopped between CREATE TABLE and setting them, or when the key changed (a new
    primary key in the source, a new `key:`). Iceberg makes only required columns
    identifier fields and cannot make an optional column required: when a column of the
    new key may hold NULL in the table, the old key's fields are dropped rather than
    left naming a key the table no longer has."""
    ice = lake_table(spark, table)
    have = set(_key_names(ice)) if ice is not None else set()
    if have == set(key_names):
        return
    fields = {f.name: f for f in ice.schema().fields} if ice is not None else {}
    optional = [k for k in key_names if k not in fields or fields[k].optional]
    if not optional:
        spark.sql(
            f"ALTER TABLE {table} SET IDENTIFIER FIELDS {', '.join(quote(k) for k in key_names)}"
        )
        log.info("%s: identifier fields set to %s", table, list(key_names))
    elif have:
        spark.sql(
            f"ALTER TABLE {table} DROP IDENTIFIER FIELDS "
            f"{', '.join(quote(k) for k in sorted(have))}"
        )
        log.warning(
            "%s: the key is now %s, but %s may hold NULL in the table, which "
            "Iceberg cannot make an identifier field: the old identifier fields %s "
            "were dropped. A rebuild backfill creates the table with the new key.",
            table,
            list(key_names),
            optional,
            sorted(have),
        )


def ensure_table(
    spark: SparkSession,
    table: str,
    schema: TopicSchema,
    properties: Mapping[str, str],
    partition_by: Sequence[str],
    soft_delete: bool,
    existing: Mapping[str, str],
) -> list[str]:
    """Create the table on first sight, or evolve it: add new columns, widen promoted
    ones. A table created with the other `delete_mode` is refused (ConfigError). Returns
    the table's source columns (metadata columns excluded), which may include columns
    the source has dropped since. `existing`: the table's column types as the caller
    read them (empty: it does not exist)."""
    keys = ", ".join(quote(k) for k in schema.key_names)
    if not existing:
        _create(
            spark, table, build_create_sql(table, schema, properties, partition_by, soft_delete)
        )
        if schema.key_names:
            spark.sql(f"ALTER TABLE {table} SET IDENTIFIER FIELDS {keys}")
        log.info("created %s with key %s", table, schema.key_names)
        return [c.name for c in schema.columns]
    if soft_delete != (DELETED in existing):
        mode, was = ("soft", "hard") if soft_delete else ("hard", "soft")
        raise ConfigError(
            f"{table}: delete_mode is {mode}, but the table was created with {was} deletes "
            f"({'no ' if soft_delete else ''}{DELETED} column); nothing was written. Set "
            f"delete_mode back to {was}, or rebuild the table (backfill in rebuild mode) to "
            "change how it deletes."
        )
    if schema.key_names:
        _follow_key(spark, table, schema.key_names)
    for c in schema.columns:
        old = existing.get(c.name)
        if old is None:
            spark.sql(f"ALTER TABLE {table} ADD COLUMN {quote(c.name)} {c.type}")
            log.info("%s: added column %s %s", table, c.name, c.type)
        elif old != c.type and widens(old, c.type):
            spark.sql(f"ALTER TABLE {table} ALTER COLUMN {quote(c.name)} TYPE {c.type}")
            log.info("%s: widened column %s from %s to %s", table, c.name, old, c.type)
        elif old != c.type and not widens(c.type, old):
            raise DecodeError(
                f"{table}: column {c.name!r} is {old} in the table but {c.type} in the new "
                "records, which Iceberg cannot promote. Rename the column in the source, or "
                "rebuild the table (backfill in rebuild mode)."
            )
    names = [c.name for c in schema.columns]
    internal = {*METADATA_COLUMNS, DELETED}
    return names + [n for n in existing if n not in names and n not in internal]


def append_with(frame: DataFrame, target: str, properties: Mapping[str, str]) -> None:
    """Append `frame`'s rows to `target` (a table, or a branch: `<table>.branch_<name>`) in
    one commit whose snapshot summary carries `properties`; an empty frame commits a
    snapshot of no data change. Iceberg takes summary properties from a write's options
    (`snapshot-property.<name>`), on a classic session and a Spark Connect one alike."""
    writer = frame.writeTo(target)
    for key, value in properties.items():
        writer = writer.option(f"snapshot-property.{key}", value)
    writer.append()


def load_iceberg_table(spark: SparkSession, table: str) -> JvmObject:
    """The JVM Iceberg `Table` behind a Spark table name (catalog.namespace.table)."""
    jvm: Any = spark.sparkContext._jvm
    return jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, table)


def fresh_table(spark: SparkSession, table: str) -> JvmObject:
    """`load_iceberg_table` with its metadata read again: as other writers left it."""
    ice = load_iceberg_table(spark, table)
    ice.refresh()
    return ice


def spark_actions(spark: SparkSession) -> JvmObject:
    """Iceberg's Spark actions (compaction, expiry, orphan removal) through the JVM."""
    jvm: Any = spark.sparkContext._jvm
    return jvm.org.apache.iceberg.spark.actions.SparkActions.get(spark._jsparkSession)


def jvm_ancestors(ice: JvmObject, table: str) -> Iterator[tuple[int, int, dict[str, str]]]:
    """(snapshot id, timestamp ms, summary) of a JVM Iceberg table, from its current
    snapshot back to the root; an expired parent on the way is a DataLossError."""
    snap = ice.currentSnapshot()
    while snap is not None:
        yield int(snap.snapshotId()), int(snap.timestampMillis()), dict(snap.summary())
        parent = snap.parentId()
        if parent is None:
            return
        older = ice.snapshot(parent)
        if older is None:
            raise expired_ancestor_error(table, snap.snapshotId(), parent)
        snap = older


def committed_offsets(spark: SparkSession, table: str) -> dict[TopicPartition, int]:
    """The table's committed offsets, by the planner's walk (`committed_from_snapshots`),
    from the table's metadata as it is now."""
    ice = lake_table(spark, table)
    return {} if ice is None else committed_from_snapshots(summaries(ice, table))


def commit_empty(
    spark: SparkSession, table: str, properties: Mapping[str, str], branch: str = "main"
) -> None:
    """A snapshot with no data change, carrying the summary (offsets moved, rows did not)."""
    target = table if branch == "main" else f"{table}.branch_{branch}"
    append_with(spark.table(table).where("false"), target, properties)


@dataclass(frozen=True)
class TableState:
    """A target table as the load finds it, from one read of its metadata."""

    exists: bool
    committed: dict[TopicPartition, int]
    snapshot_id: int | None
    # no change at or below this LSN writes a row: the last truncate loaded (its commit's
    # summary, or the property older versions set)
    truncated_below: int | None = None
    rows: int = 0  # records in its data files (deleted ones too): how big a MERGE target it is
    # no data file at all: no snapshot, or one whose summary says 0 records (a summary
    # without the count is not taken for empty)
    empty: bool = False
    properties: Mapping[str, str] = field(default_factory=dict)
    # the current partition spec's fields: (name, transform as Iceberg writes it, column)
    partition_fields: tuple[tuple[str, str, str], ...] = ()
    # the LSN of the last truncate a committed load applied (its commit's summary)
    truncate_applied: int | None = None
    key_names: tuple[str, ...] = ()  # its identifier fields: the key its loads gave it
    heal: str | None = None  # the retention gap it heals (`SUMMARY_HEAL`'s JSON), if any


def table_state(spark: SparkSession, table: str) -> TableState:
    """Whether the table exists, its committed offsets and current snapshot: one read of
    its metadata."""
    ice = lake_table(spark, table)
    if ice is None:
        return TableState(False, {}, None, empty=True)
    snap = ice.current_snapshot()
    last = offsets_summary(summaries(ice, table))
    committed = offsets_in(last)
    applied = last.get(SUMMARY_TRUNCATE)
    properties = dict(ice.properties)
    below = [int(x) for x in (applied, properties.get(TRUNCATED_BELOW)) if x is not None]
    rows = summary_of(snap).get("total-records") if snap is not None else None
    schema = ice.schema()
    fields = tuple(
        (f.name, str(f.transform), str(schema.find_column_name(f.source_id)))
        for f in ice.spec().fields
    )
    return TableState(
        True,
        committed,
        snap.snapshot_id if snap is not None else None,
        max(below, default=None),
        int(rows) if rows is not None else 0,
        truncate_applied=int(applied) if applied is not None else None,
        key_names=_key_names(ice),
        empty=snap is None or rows == "0",
        properties=properties,
        partition_fields=fields,
        heal=last.get(SUMMARY_HEAL),
    )


def _key_names(ice: LakeTable) -> tuple[str, ...]:
    schema = ice.schema()
    return tuple(str(schema.find_column_name(i)) for i in sorted(schema.identifier_field_ids))


def property_changes(
    current: Mapping[str, str], wanted: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """What brings a table's properties (`current`) to the pipeline's (`wanted`): the
    properties to set and those to unset.

    - A new or changed value is set; a property Iceberg keeps in the metadata instead
      (format-version) never counts as changed, or every load would set it again.
    - A property the pipeline set before (`PIPELINE_PROPERTIES`) and no longer names is
      unset, or set back to cdclake's own value for those it sets at creation
      (`TABLE_PROPERTIES`). A table without the record (created before it was kept) has
      nothing unset.
    - The record itself follows the pipeline's names."""
    try:
        before = set(json.loads(current.get(PIPELINE_PROPERTIES) or "[]"))
    except ValueError:
        before = set()
    to_set = {
        k: v for k, v in wanted.items() if k not in RESERVED_PROPERTIES and current.get(k) != v
    }
    to_unset = []
    for k in sorted(before - set(wanted) - RESERVED_PROPERTIES - {PIPELINE_PROPERTIES}):
        if k in TABLE_PROPERTIES:
            if current.get(k) != TABLE_PROPERTIES[k]:
                to_set[k] = TABLE_PROPERTIES[k]
        elif k in current:
            to_unset.append(k)
    record = pipeline_properties_value(wanted)
    if current.get(PIPELINE_PROPERTIES) != record:
        to_set[PIPELINE_PROPERTIES] = record
    return to_set, to_unset


def apply_table_settings(
    spark: SparkSession,
    table: str,
    state: TableState,
    properties: Mapping[str, str],
    partition_by: Sequence[str],
) -> list[str]:
    """Bring an existing table's properties and partition spec to the pipeline's: a
    property whose value differs is set, one the pipeline set before and no longer
    names is unset (`property_changes`); partition fields the pipeline no longer names
    are dropped and new ones added (Iceberg's partition evolution: data written before
    keeps its layout). Returns what changed, for the log."""
    changed = []
    to_set, to_unset = property_changes(state.properties, properties)
    if to_set:
        spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ({_properties_sql(to_set)})")
        changed += [f"property {k}={v!r}" for k, v in to_set.items() if k != PIPELINE_PROPERTIES]
    if to_unset:
        names = ", ".join(f"'{_sql_text(k)}'" for k in to_unset)
        spark.sql(f"ALTER TABLE {table} UNSET TBLPROPERTIES ({names})")
        changed += [f"property {k} unset" for k in to_unset]
    wanted = {partition_field(spec): spec for spec in partition_by}
    have = {(transform, column): name for name, transform, column in state.partition_fields}
    for field_, name in have.items():
        if field_ not in wanted:
            spark.sql(f"ALTER TABLE {table} DROP PARTITION FIELD {quote(name)}")
            changed.append(f"partition field {name} dropped")
    for field_, spec in wanted.items():
        if field_ not in have:
            spark.sql(f"ALTER TABLE {table} ADD PARTITION FIELD {spec}")
            changed.append(f"partition field {spec} added")
    if changed:
        log.info("%s: table settings changed to the pipeline's: %s", table, "; ".join(changed))
    return changed


def current_snapshot(spark: SparkSession, table: str) -> tuple[int | None, dict[str, str]]:
    """Snapshot id and summary of the table's current snapshot, as it is now."""
    ice = lake_table(spark, table)
    snap = None if ice is None else ice.current_snapshot()
    if snap is None:
        return None, {}
    return snap.snapshot_id, summary_of(snap)
