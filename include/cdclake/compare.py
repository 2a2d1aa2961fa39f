"""Does the lake equal the source? Row-for-row comparison of each Iceberg table with its
PostgreSQL table, values normalised to comparable Python objects."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from cdclake.catalog import load_catalog
from cdclake.changes import DELETED, METADATA_COLUMNS
from cdclake.config import PipelineConfig, TableConfig
from cdclake.exceptions import EndpointError


@dataclass
class TableComparison:
    source: str
    target: str
    columns: list[str]
    source_rows: list[tuple]
    lake_rows: list[tuple]
    missing: list[tuple] = field(default_factory=list)  # in the source, not in the lake
    extra: list[tuple] = field(default_factory=list)  # in the lake, not in the source
    missing_columns: list[str] = field(default_factory=list)  # source columns not in the lake

    @property
    def equal(self) -> bool:
        return not self.missing and not self.extra and not self.missing_columns


def normalize(value: Any) -> Any:
    """Make PostgreSQL (psycopg) and Iceberg (pyarrow) values compare equal when they are."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC)
    if isinstance(value, dt.time):
        return value.isoformat(timespec="microseconds")
    if isinstance(value, Decimal):
        return value.normalize() if value.is_finite() else str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, list):
        return tuple(normalize(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return value


def lake_rows(
    pipeline: PipelineConfig, table: TableConfig, cat=None
) -> tuple[list[str], list[tuple]]:
    from pyiceberg.exceptions import NoSuchTableError

    cat = cat or load_catalog(pipeline.catalog)
    try:
        ice = cat.load_table((pipeline.namespace, table.target))
    except NoSuchTableError:
        return [], []
    data = ice.scan().to_arrow()
    if DELETED in data.column_names:  # soft deletes: flagged rows are not source rows
        import pyarrow.compute as pc

        data = data.filter(pc.invert(pc.fill_null(data.column(DELETED), False)))
    columns = [c for c in data.column_names if c not in METADATA_COLUMNS and c != DELETED]
    rows = list(zip(*(data.column(c).to_pylist() for c in columns), strict=True)) if columns else []
    return columns, [tuple(normalize(v) for v in row) for row in rows]


def source_rows(dsn: str, table: TableConfig, columns: list[str]) -> list[tuple]:
    import psycopg
    from psycopg import sql

    query = sql.SQL("SELECT {} FROM {}.{}").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in columns),
        sql.Identifier(table.source_schema),
        sql.Identifier(table.source_table),
    )
    try:
        with psycopg.connect(dsn) as conn:
            return [tuple(normalize(v) for v in row) for row in conn.execute(query).fetchall()]
    except psycopg.OperationalError as exc:
        raise EndpointError(f"source database could not be reached: {exc}") from exc


def _source_columns(dsn: str, table: TableConfig) -> list[str]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "select column_name from information_schema.columns "
            "where table_schema = %s and table_name = %s order by ordinal_position",
            (table.source_schema, table.source_table),
        ).fetchall()
    return [r[0] for r in rows]


def _json_columns(dsn: str, table: TableConfig) -> set[str]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "select column_name from information_schema.columns where table_schema = %s "
            "and table_name = %s and data_type in ('json', 'jsonb')",
            (table.source_schema, table.source_table),
        ).fetchall()
    return {r[0] for r in rows}


def canonical_json(value: Any) -> Any:
    """JSON text or a parsed JSON value -> one canonical text (key order, spacing)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _canonical_rows(rows: list[tuple], positions: list[int]) -> list[tuple]:
    if not positions:
        return rows
    out = []
    for row in rows:
        values = list(row)
        for i in positions:
            values[i] = canonical_json(values[i])
        out.append(tuple(values))
    return out


def compare_table(pipeline: PipelineConfig, table: TableConfig, dsn: str, cat=None):
    lake_columns, lake = lake_rows(pipeline, table, cat)
    source_columns = [c for c in _source_columns(dsn, table) if c not in table.exclude]
    columns = [c for c in lake_columns if c in source_columns] or source_columns
    keep = [lake_columns.index(c) for c in columns if c in lake_columns]
    lake = [tuple(row[i] for i in keep) for row in lake] if lake_columns else []
    source = source_rows(dsn, table, columns)
    json_cols = _json_columns(dsn, table)
    positions = [i for i, c in enumerate(columns) if c in json_cols]
    source, lake = _canonical_rows(source, positions), _canonical_rows(lake, positions)
    s_set, l_set = _multiset(source), _multiset(lake)
    missing = sorted((s_set - l_set).elements(), key=repr)
    extra = sorted((l_set - s_set).elements(), key=repr)
    return TableComparison(
        source=table.source,
        target=pipeline.qualified_target(table),
        columns=columns,
        source_rows=sorted(source, key=repr),
        lake_rows=sorted(lake, key=repr),
        missing=missing,
        extra=extra,
        missing_columns=[c for c in source_columns if lake_columns and c not in lake_columns],
    )


def _multiset(rows):
    from collections import Counter

    return Counter(rows)


def compare_pipeline(pipeline: PipelineConfig, dsn: str) -> list[TableComparison]:
    cat = load_catalog(pipeline.catalog)
    return [compare_table(pipeline, t, dsn, cat) for t in pipeline.tables]


def render_comparison(results: list[TableComparison], max_rows: int = 12) -> str:
    """Each source table beside its lake table, then a verdict."""
    out: list[str] = []
    for r in results:
        verdict = "EQUAL" if r.equal else "DIFFERENT"
        out.append(f"== {r.source} (PostgreSQL)  |  {r.target} (Iceberg)  -> {verdict}")
        width = 60
        header = ", ".join(r.columns)
        out.append(f"   {_cut(header, width):<{width}} | {_cut(header, width)}")
        for i in range(min(max(len(r.source_rows), len(r.lake_rows)), max_rows)):
            left = _cut(_fmt(r.source_rows[i]), width) if i < len(r.source_rows) else ""
            right = _cut(_fmt(r.lake_rows[i]), width) if i < len(r.lake_rows) else ""
            mark = " " if (left == right) else "*"
            out.append(f" {mark} {left:<{width}} | {right}")
        more = max(len(r.source_rows), len(r.lake_rows)) - max_rows
        if more > 0:
            out.append(f"   ... {more} more rows")
        out.append(f"   rows: source {len(r.source_rows)}, lake {len(r.lake_rows)}")
        if r.missing_columns:
            out.append(f"   columns missing from the lake: {', '.join(r.missing_columns)}")
        for row in r.missing[:5]:
            out.append(f"   missing from the lake: {_fmt(row)}")
        for row in r.extra[:5]:
            out.append(f"   only in the lake:      {_fmt(row)}")
        out.append("")
    ok = all(r.equal for r in results)
    out.append("VERDICT: lake equals source" if ok else "VERDICT: lake differs from source")
    return "\n".join(out)


def _fmt(row: tuple) -> str:
    return ", ".join("NULL" if v is None else str(v) for v in row)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
