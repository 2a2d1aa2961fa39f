"""A keyed table's history table (`history: true`): `<table>_history`, a row per version of
each row (SCD type 2, `cdclake.resolve.history`), beside the table.

Its columns are the table's, then `_valid_from` and `_valid_to` (source commit times; the
open version's `_valid_to` is NULL), `_is_current`, the change that opened the version
(`_cdc_op`, `_cdc_source_ts`, `_cdc_lsn`, `_cdc_kafka_partition`, `_cdc_kafka_offset`)
and the LSN of the one that closed it (`_cdc_closed_lsn`). A batch writes it before the
table, in one commit that carries its offsets; a batch written again (its table's commit
failed) finds every change re-sent and adds nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cdclake.config import HISTORY_SUFFIX
from cdclake.debezium.connect import arrow_type
from cdclake.debezium.schema import (
    DELETED,
    LSN,
    METADATA_COLUMNS,
    OFFSET,
    OP,
    PARTITION,
    SOURCE_TS,
    Column,
    TopicSchema,
)
from cdclake.iceberg.merge_sql import quote
from cdclake.iceberg.tables import (
    TableState,
    append_with,
    ensure_table,
    table_columns,
    table_state,
)
from cdclake.iceberg.write import committing
from cdclake.offsets import (
    SUMMARY_BATCH,
    SUMMARY_OFFSETS,
    SUMMARY_RECORDS,
    SUMMARY_TRUNCATE,
    TopicPartition,
    encode_offsets,
)
from cdclake.resolved import CURRENT, VALID_FROM, VALID_TO, Before, Changed, Key, Version

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

CLOSED_LSN = "_cdc_closed_lsn"
UPDATED_LSN = "_cdc_updated_lsn"  # the last change of untracked columns taken in place
# the columns a history table has beside the table's (and the metadata ones every table has)
HISTORY_COLUMNS = {
    VALID_FROM: "timestamp",
    VALID_TO: "timestamp",
    CURRENT: "boolean",
    CLOSED_LSN: "bigint",
    UPDATED_LSN: "bigint",
}
_NEW = "_cdc_new"  # a staged row is a new version (else one from before the batch)


def history_table(qualified: str) -> str:
    return qualified + HISTORY_SUFFIX


def history_schema(schema: TopicSchema) -> TopicSchema:
    """The history table's columns (before the metadata ones every table has)."""
    extra = tuple(Column(name, type_) for name, type_ in HISTORY_COLUMNS.items())
    return TopicSchema((), (*schema.columns, *extra), schema.format)


def history_state(
    spark: SparkSession,
    qualified: str,
    schema: TopicSchema,
    properties: Mapping[str, str],
    table: TableState,
) -> TableState:
    """The history table of table `qualified` as a batch finds it: made on first sight with
    the table's `properties`, holding the rows of the table (`table`: its state) as their
    open versions; given the table's new columns."""
    target = history_table(qualified)
    state = table_state(spark, target)
    known = table_columns(spark, target) if state.exists else {}
    # by the current flag: a batch's closes scan the open versions only
    ensure_table(spark, target, history_schema(schema), properties, (CURRENT,), False, known)
    if not state.exists and not table.empty:
        _seed(spark, qualified, target, table)
        state = table_state(spark, target)
    return state


def history_before(
    spark: SparkSession,
    qualified: str,
    schema: TopicSchema,
    lookup: tuple[set[Key], set[tuple[Key, int]]],
    state: TableState,
) -> Before:
    """What the history (`state`: as `history_state` found it) holds of the batch's keys
    and of the old keys of its key changes (`lookup`: the keys, and (old key, the
    change's LSN) pairs)."""
    keys, pointers = lookup
    if not state.exists or not (keys or pointers):
        return Before(truncated=state.truncate_applied)
    target = history_table(qualified)
    return _before(spark, target, schema, keys, pointers, state.truncate_applied)


def _seed(spark: SparkSession, qualified: str, target: str, table: TableState) -> None:
    """The table's rows as the history's first versions, open since their last change,
    at the table's offsets: a history turned on for a table already loaded."""
    have = table_columns(spark, qualified)
    meta = {VALID_FROM: SOURCE_TS, CURRENT: "true", OP: OP, SOURCE_TS: SOURCE_TS, LSN: LSN}
    meta |= {PARTITION: PARTITION, OFFSET: OFFSET}
    values = [
        f"{meta.get(n) or (quote(n) if n in have and n != DELETED else 'NULL')} AS {quote(n)}"
        for n in table_columns(spark, target)
    ]
    live = f" WHERE NOT coalesce({DELETED}, false)" if DELETED in have else ""
    props = {SUMMARY_OFFSETS: encode_offsets(table.committed), SUMMARY_BATCH: "history-seed"}
    append_with(spark.sql(f"SELECT {', '.join(values)} FROM {qualified}{live}"), target, props)
    log.info("%s: the rows of %s taken as their open versions", target, qualified)


def written(state: TableState, ends: Mapping[TopicPartition, int]) -> bool:
    """Whether the history already holds the batch of offsets up to `ends` (written before
    its table's commit failed)."""
    return bool(ends) and all(state.committed.get(tp, -1) >= end for tp, end in ends.items())


def commit_history(
    spark: SparkSession,
    qualified: str,
    schema: TopicSchema,
    state: TableState,
    changed: Changed,
    ends: Mapping[TopicPartition, int],
    batch_id: str,
) -> int | None:
    """Write what the batch does to the history of table `qualified` (`changed`), the
    batch's offsets (`ends`) in the same commit; the snapshot that carries them."""
    target = history_table(qualified)
    offsets = {**state.committed}
    for tp, end in ends.items():
        offsets[tp] = max(end, offsets.get(tp, 0))
    truncated = [x for x in (state.truncate_applied, *(t for t, _ in changed.truncates)) if x]
    props = {
        SUMMARY_OFFSETS: encode_offsets(offsets),
        SUMMARY_BATCH: batch_id,
        SUMMARY_RECORDS: str(len(changed.versions)),
        **({SUMMARY_TRUNCATE: str(max(truncated))} if truncated else {}),
    }
    view = f"cdclake_history_{target.replace('.', '_')}"
    with committing(spark, target, state.snapshot_id, batch_id, props) as commit:
        into = commit.target
        if changed.versions or changed.earlier or changed.truncates:
            _staged_rows(spark, schema, changed).createOrReplaceTempView(view)
            try:
                for sql in _write_sql(into, view, schema, changed, table_columns(spark, target)):
                    spark.sql(sql)
            finally:
                spark.catalog.dropTempView(view)
    after = commit.snapshot_id
    log.info(
        "%s: %d versions opened, %d closed before the batch",
        target,
        len(changed.versions),
        len(changed.earlier),
    )
    return after


def _before(
    spark: SparkSession,
    target: str,
    schema: TopicSchema,
    keys: set[Key],
    pointers: set[tuple[Key, int]],
    truncated: int | None,
) -> Before:
    """What the history holds of the batch's keys: each one's latest version and highest
    LSN, and the old keys' versions before the batch's key changes."""
    latest: dict[Key, Version] = {}
    high: dict[Key, int] = {}
    for row in _versions_of(spark, target, schema, keys, latest=True):
        version = _version(row, schema)
        latest[version.key] = version
        if row[_HIGH] != _NO_LSN:
            high[version.key] = row[_HIGH]
    by_key: dict[Key, list[Version]] = {}
    olds = {k for k, _ in pointers}
    for row in _versions_of(spark, target, schema, olds, latest=False) if olds else []:
        version = _version(row, schema)
        by_key.setdefault(version.key, []).append(version)
    as_of = {}
    for key, lsn in pointers:
        older = [v for v in by_key.get(key, []) if v.lsn is not None and v.lsn < lsn]
        if older:
            as_of[(key, lsn)] = max(older, key=_recency).values
    return Before(latest, as_of, truncated, high)


def _recency(v: Version) -> tuple[bool, int, int]:
    """The order of a key's versions, latest last: the open one, else by start and LSN."""
    return (v.end is None, v.start, v.lsn if v.lsn is not None else -1)


_HIGH, _NO_LSN = "_cdc_high", -(2**63)


def _versions_of(
    spark: SparkSession, target: str, schema: TopicSchema, keys: set[Key], latest: bool
) -> list[dict[str, Any]]:
    """Every version of `keys` in the history, as Arrow reads them (the batch's types); with
    `latest`, each key's latest (`_recency`) with its highest LSN (`_HIGH`)."""
    import pyarrow as pa

    from cdclake.kafka.reader import arrow_frame

    if not keys:
        return []
    key_table = pa.table(
        {
            k.name: pa.array([key[i] for key in keys], arrow_type(k.type))
            for i, k in enumerate(schema.key)
        }
    )
    ddl = ", ".join(f"{quote(k.name)} {k.type}" for k in schema.key)
    view = f"cdclake_history_keys_{target.replace('.', '_')}"
    arrow_frame(spark, key_table, ddl).createOrReplaceTempView(view)
    on = " AND ".join(f"h.{quote(k)} = k.{quote(k)}" for k in schema.key_names)
    sql = f"SELECT h.* FROM {target} h LEFT SEMI JOIN {view} k ON {on}"
    if latest:
        by = ", ".join(quote(k) for k in schema.key_names)
        lsns = ", ".join(f"coalesce({n}, {_NO_LSN})" for n in (LSN, CLOSED_LSN, UPDATED_LSN))
        lsns = f"greatest({lsns})"
        order = f"{CURRENT} DESC, {VALID_FROM} DESC, {LSN} DESC NULLS LAST"
        sql = (
            f"SELECT * FROM (SELECT v.*, max({lsns}) OVER (PARTITION BY {by}) AS {_HIGH}, "
            f"row_number() OVER (PARTITION BY {by} ORDER BY {order}) AS _cdc_rank "
            f"FROM ({sql}) v) WHERE _cdc_rank = 1"
        )
    try:
        batches = spark.sql(sql)._collect_as_arrow()
    finally:
        spark.catalog.dropTempView(view)
    rows: list[dict[str, Any]] = pa.Table.from_batches(batches).to_pylist() if batches else []
    return rows


def _ms(value: Any) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


def _version(row: Mapping[str, Any], schema: TopicSchema) -> Version:
    return Version(
        key=tuple(row[k] for k in schema.key_names),
        values={c.name: row[c.name] for c in schema.columns},
        start=_ms(row[VALID_FROM]) or 0,
        lsn=row[LSN],
        partition=row[PARTITION],
        offset=row[OFFSET],
        op=row[OP],
        end=_ms(row[VALID_TO]),
        end_lsn=row[CLOSED_LSN],
        updated_lsn=row.get(UPDATED_LSN),
    )


def _staged_rows(spark: SparkSession, schema: TopicSchema, changed: Changed) -> Any:
    """The batch's new versions and the versions from before it that it changed, as a
    DataFrame."""
    from cdclake.kafka.reader import arrow_frame

    rows = [*changed.versions, *changed.earlier]
    columns = [(c.name, c.type) for c in schema.columns]
    meta = [*HISTORY_COLUMNS.items(), *METADATA_COLUMNS.items(), (_NEW, "boolean")]
    data: dict[str, list[Any]] = {name: [v.values.get(name) for v in rows] for name, _ in columns}
    starts = [v.start * 1000 for v in rows]
    data |= {
        VALID_FROM: starts,
        VALID_TO: [None if v.end is None else v.end * 1000 for v in rows],
        CURRENT: [v.end is None for v in rows],
        CLOSED_LSN: [v.end_lsn for v in rows],
        UPDATED_LSN: [v.updated_lsn for v in rows],
        OP: [v.op for v in rows],
        SOURCE_TS: starts,
        LSN: [v.lsn for v in rows],
        PARTITION: [v.partition for v in rows],
        OFFSET: [v.offset for v in rows],
        _NEW: [True] * len(changed.versions) + [False] * len(changed.earlier),
    }
    table = _arrow(data, [*columns, *meta])
    ddl = ", ".join(f"{quote(n)} {t}" for n, t in [*columns, *meta])
    return arrow_frame(spark, table, ddl)


def _arrow(data: Mapping[str, list[Any]], columns: Sequence[tuple[str, str]]) -> pa.Table:
    import pyarrow as pa

    arrays = []
    for name, type_ in columns:
        kind = arrow_type(type_)
        if pa.types.is_timestamp(kind) and name in (VALID_FROM, VALID_TO, SOURCE_TS):
            arrays.append(pa.array(data[name], pa.int64()).cast(kind))
        else:
            arrays.append(pa.array(data[name], kind))
    return pa.table(arrays, names=[n for n, _ in columns])


def _write_sql(
    target: str, view: str, schema: TopicSchema, changed: Changed, columns: Iterable[str]
) -> list[str]:
    """Set the versions from before the batch that it changed (closed, or their untracked
    columns taken), and at a truncate close every other open version; then append the
    new versions (`columns`: the history table's, in order; those the batch lacks NULL)."""
    staged = {c.name for c in schema.columns} | set(HISTORY_COLUMNS) | set(METADATA_COLUMNS)
    values = ", ".join(quote(n) if n in staged else "NULL" for n in columns)
    out = []
    if changed.earlier or changed.truncates:
        changes = [*(c.name for c in schema.columns), VALID_TO, CURRENT, CLOSED_LSN, UPDATED_LSN]
        update = ", ".join(f"{quote(n)} = s.{quote(n)}" for n in changes)
        merge = (
            f"MERGE INTO {target} t USING (SELECT * FROM {view} WHERE NOT {_NEW}) s "
            f"ON t.{CURRENT} AND t.{PARTITION} = s.{PARTITION} AND t.{OFFSET} = s.{OFFSET} "
            f"WHEN MATCHED THEN UPDATE SET {update}"
        )
        if changed.truncates:
            lsn, ms = changed.truncates[0]
            closed = "NULL" if lsn is None else str(int(lsn))
            merge += (
                f" WHEN NOT MATCHED BY SOURCE AND t.{CURRENT} THEN UPDATE SET "
                f"{VALID_TO} = timestamp_millis({int(ms)}), {CURRENT} = false, "
                f"{CLOSED_LSN} = {closed}"
            )
        out.append(merge)
    if changed.versions:
        out.append(f"INSERT INTO {target} SELECT {values} FROM {view} WHERE {_NEW}")
    return out
