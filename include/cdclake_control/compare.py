"""Does the lake equal the source? Each Iceberg table is compared with its PostgreSQL
table row for row, inside PostgreSQL: the lake rows are sent as JSON, turned back into
the source column types with PostgreSQL's own input functions, and compared with
`EXCEPT ALL` both ways, so equality is PostgreSQL's equality for every type."""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from cdclake.config import HISTORY_SUFFIX, ConnectorModes, PipelineConfig, TableConfig
from cdclake.debezium.connect import (
    LAKE_MAX_DATE,
    LAKE_MAX_TIMESTAMP,
    LAKE_MIN_DATE,
    LAKE_MIN_TIMESTAMP,
)
from cdclake.debezium.schema import DELETED, METADATA_COLUMNS
from cdclake.exceptions import EndpointError
from cdclake.iceberg.catalog import load_catalog
from cdclake.iceberg.history import HISTORY_COLUMNS
from cdclake.resolved import CURRENT

from cdclake_control.source import connect_source, describe_dsn

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa
    from pyiceberg.catalog import Catalog

DEFAULT_MODES = ConnectorModes()
_NUMERIC = ("numeric", "money")


@dataclass
class TableComparison:
    source: str
    target: str
    columns: list[str]
    source_rows: list[tuple[Any, ...]]
    lake_rows: list[tuple[Any, ...]]
    missing: list[tuple[Any, ...]] = field(default_factory=list)  # in the source, not in the lake
    extra: list[tuple[Any, ...]] = field(default_factory=list)  # in the lake, not in the source
    missing_columns: list[str] = field(default_factory=list)  # source columns not in the lake

    @property
    def equal(self) -> bool:
        return not self.missing and not self.extra and not self.missing_columns


@dataclass(frozen=True)
class SourceColumn:
    name: str
    type: str  # format_type(): 'numeric(12,4)', 'inventory.mood', 'integer[]' ...
    base: str  # pg_type.typname of the column or of its array element
    is_array: bool


def _json_value(value: Any, bits: bool = False) -> Any:
    """A lake value as JSON that PostgreSQL's input functions read back exactly."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return int.from_bytes(data, "little") if bits else base64.b64encode(data).decode()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value).replace("inf", "Infinity").replace("nan", "NaN")
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, list):
        return [_json_value(v, bits) for v in value]
    if isinstance(value, dict):
        return {k: _json_value(v, bits) for k, v in value.items()}
    return value


def _lake_expr(c: SourceColumn, modes: ConnectorModes = DEFAULT_MODES) -> str:
    """SQL turning the lake value in jsonb `j` back into something comparable."""
    ref = "j->" + _lit(c.name)
    text = "j->>" + _lit(c.name)
    if c.base == "bytea" and not c.is_array and modes.binary_handling_mode != "bytes":
        if modes.binary_handling_mode == "hex":
            return f"decode({text}, 'hex')"
        if modes.binary_handling_mode == "base64-url-safe":
            padded = f"rpad(translate({text}, '-_', '+/'), (length({text}) + 3) / 4 * 4, '=')"
            return f"decode({padded}, 'base64')"
        return f"decode({text}, 'base64')"
    if c.base == "interval" and modes.interval_handling_mode == "string":
        return f"({text})::interval"
    if c.base in _NUMERIC and modes.decimal_handling_mode == "double":
        return f"({text})::float8"
    if c.base == "hstore" and modes.hstore_handling_mode == "map":  # Arrow map: [[k, v], ...]
        pairs = f"(SELECT jsonb_object_agg(p->>0, p->1) FROM jsonb_array_elements({ref}) p)"
        return f"CASE WHEN jsonb_typeof({ref}) = 'array' THEN coalesce({pairs}, '{{}}') END"
    if c.is_array:
        return (
            f"CASE WHEN jsonb_typeof({ref}) = 'array' THEN ARRAY(SELECT x FROM "
            f"jsonb_array_elements_text({ref}) x)::{c.type} END"
        )
    if c.base == "bytea":
        return f"decode({text}, 'base64')"
    if c.type == "bit(1)":  # Debezium sends bit(1) as a boolean
        return f"({text})::boolean"
    if c.base in ("bit", "varbit"):
        return f"({text})::numeric"
    if c.base == "timetz":
        return f"(({text})::timetz AT TIME ZONE 'UTC')"
    if c.base == "interval":  # Debezium MicroDuration: microseconds, 30.4375-day months
        return f"({text})::numeric"
    if c.base == "point":
        return f"(({text})::jsonb - 'wkb' - 'srid')"
    if c.base in ("geometry", "geography"):
        return f"CASE WHEN jsonb_typeof({ref}) = 'object' THEN {ref} END"
    if c.base in ("json", "jsonb", "hstore"):
        return f"({text})::jsonb"
    if c.base == "xml":
        return text
    return f"({text})::{c.type}"


def _source_expr(c: SourceColumn, modes: ConnectorModes = DEFAULT_MODES) -> str:
    col = _ident(c.name)
    if c.is_array:
        return col
    if c.base == "interval" and modes.interval_handling_mode == "string":
        return col
    if c.base in _NUMERIC and modes.decimal_handling_mode == "double":
        return f"{col}::numeric::float8"  # the precision the double mode keeps
    if modes.time_precision_mode == "connect" and c.base == "time":
        truncated = f"date_trunc('milliseconds', {col}::interval)::time"  # connect keeps ms
        return f"CASE WHEN {col} = '24:00:00' THEN {col} ELSE {truncated} END"
    if c.base in ("date", "timestamp", "timestamptz"):  # ±infinity as the load maps them
        if c.base == "date":
            top, bottom = LAKE_MAX_DATE, LAKE_MIN_DATE
        else:
            zone = "+00" if c.base == "timestamptz" else ""
            top, bottom = LAKE_MAX_TIMESTAMP + zone, LAKE_MIN_TIMESTAMP + zone
        value = col
        if modes.time_precision_mode == "connect" and c.base == "timestamp":
            value = f"date_trunc('milliseconds', {col})"  # connect mode keeps milliseconds
        return (
            f"CASE WHEN {col} = 'infinity' THEN '{top}'::{c.type} "
            f"WHEN {col} = '-infinity' THEN '{bottom}'::{c.type} ELSE {value} END"
        )
    if c.base == "timetz":
        return f"({col} AT TIME ZONE 'UTC')"
    if c.base == "interval":
        months = f"(extract(year from {col}) * 12 + extract(month from {col}))"
        return (
            f"round(({months} * 30.4375 + extract(day from {col})) * 86400000000"
            f" + extract(hour from {col}) * 3600000000 + extract(minute from {col}) * 60000000"
            f" + extract(second from {col}) * 1000000)"
        )
    if c.type == "bit(1)":
        return f"({col} = B'1')"
    if c.base == "point":
        point = f"jsonb_build_object('x', {col}[0], 'y', {col}[1])"
        return f"CASE WHEN {col} IS NOT NULL THEN {point} END"
    if c.base == "hstore":
        return f"hstore_to_jsonb({col})"
    if c.base in ("geometry", "geography"):  # what Debezium sends: EWKB, SRID (NULL for 0)
        ewkb = f"translate(encode(ST_AsEWKB({col}::geometry), 'base64'), E'\\n', '')"
        geo = f"jsonb_build_object('wkb', {ewkb}, 'srid', nullif(ST_SRID({col}::geometry), 0))"
        return f"CASE WHEN {col} IS NOT NULL THEN {geo} END"
    if c.base == "json":
        return f"{col}::jsonb"
    if c.base == "xml":
        return f"{col}::text"
    return col


def _bits_source_expr(c: SourceColumn) -> str:
    # the bit string read as a binary number (Debezium sends its little-endian bytes)
    col = _ident(c.name)
    value = (
        f"(SELECT coalesce(sum(2::numeric ^ (length({col}) - i)), 0) FROM "
        f"generate_series(1, length({col})) i WHERE substring({col}::text, i, 1) = '1')"
    )
    return f"CASE WHEN {col} IS NOT NULL THEN {value} END"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def source_columns(conn: psycopg.Connection[Any], table: TableConfig) -> list[SourceColumn]:
    rows = conn.execute(
        """
        select a.attname, format_type(a.atttypid, a.atttypmod),
               coalesce(elem.typname, t.typname), t.typcategory = 'A'
        from pg_attribute a
        join pg_class c on c.oid = a.attrelid
        join pg_namespace n on n.oid = c.relnamespace
        join pg_type t on t.oid = a.atttypid
        left join pg_type elem on elem.oid = t.typelem and t.typcategory = 'A'
        where n.nspname = %s and c.relname = %s and a.attnum > 0 and not a.attisdropped
        order by a.attnum
        """,
        (table.source_schema, table.source_table),
    ).fetchall()
    return [SourceColumn(name, kind, base, bool(is_array)) for name, kind, base, is_array in rows]


def lake_table(
    pipeline: PipelineConfig,
    table: TableConfig,
    cat: Catalog | None = None,
    history: bool = False,
) -> pa.Table | None:
    """The lake table as Arrow (soft-deleted rows dropped), or None if it does not exist;
    with `history`, its history table's current versions."""
    import pyarrow.compute as pc
    from pyiceberg.exceptions import NoSuchTableError

    cat = cat or load_catalog(pipeline.catalog)
    name = table.target + HISTORY_SUFFIX if history else table.target
    try:
        ice = cat.load_table((pipeline.namespace, name))
    except NoSuchTableError:
        return None
    data = ice.scan().to_arrow()
    flag = CURRENT if history else DELETED  # soft deletes: flagged rows are not source rows
    if flag in data.column_names:
        kept = pc.fill_null(data.column(flag), False)
        data = data.filter(kept if history else pc.invert(kept))
    return data.drop_columns([c for c in HISTORY_COLUMNS if c in data.column_names])


def _display(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "\\x" + bytes(value).hex()
    if isinstance(value, list):
        return tuple(_display(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(_json_value(value), sort_keys=True)
    return value


def compare_table(
    pipeline: PipelineConfig,
    table: TableConfig,
    dsn: str,
    cat: Catalog | None = None,
    history: bool = False,
) -> TableComparison:
    """The source table against its lake table (with `history`: its history table's
    current versions)."""
    import psycopg

    modes = pipeline.connector
    data = lake_table(pipeline, table, cat, history)
    lake_names = (
        []
        if data is None
        else [c for c in data.column_names if c not in METADATA_COLUMNS and c != DELETED]
    )
    try:  # whole tables are read: no statement timeout, only the connect timeout
        with connect_source(dsn, pipeline.timeouts, limit_statements=False) as conn:
            src_cols = [c for c in source_columns(conn, table) if c.name not in table.exclude]
            cols = [c for c in src_cols if c.name in lake_names] if lake_names else src_cols
            lake_dicts = data.select([c.name for c in cols]).to_pylist() if data is not None else []
            bit_cols = {
                c.name
                for c in cols
                if c.base in ("bit", "varbit") and not c.is_array and c.type != "bit(1)"
            }
            docs = [
                json.dumps({k: _json_value(v, k in bit_cols) for k, v in row.items()})
                for row in lake_dicts
            ]
            src_sql = ", ".join(
                _bits_source_expr(c) if c.name in bit_cols else _source_expr(c, modes) for c in cols
            )
            lake_sql = ", ".join(_lake_expr(c, modes) for c in cols)
            source_table = f"{_ident(table.source_schema)}.{_ident(table.source_table)}"
            conn.execute("create temp table cdclake_lake (j jsonb) on commit drop")
            with conn.cursor().copy("copy cdclake_lake (j) from stdin") as copy:
                for doc in docs:
                    copy.write_row((doc,))
            source = f"select {src_sql} from {source_table}"
            lake = f"select {lake_sql} from cdclake_lake"
            missing = conn.execute(f"select t::text from ({source} except all {lake}) t").fetchall()
            extra = conn.execute(f"select t::text from ({lake} except all {source}) t").fetchall()
            shown = ", ".join(f"{_ident(c.name)}::text" for c in cols)  # display only
            source_rows = conn.execute(f"select {shown} from {source_table}").fetchall()
    except psycopg.OperationalError as exc:
        raise EndpointError(f"source database at {describe_dsn(dsn)}: {exc}") from exc
    lake_rows = [tuple(_display(row[c.name]) for c in cols) for row in lake_dicts]
    return TableComparison(
        source=table.source,
        target=pipeline.qualified_target(table) + (HISTORY_SUFFIX if history else ""),
        columns=[c.name for c in cols],
        source_rows=sorted((tuple(_display(v) for v in r) for r in source_rows), key=repr),
        lake_rows=sorted(lake_rows, key=repr),
        missing=[tuple(r) for r in missing],
        extra=[tuple(r) for r in extra],
        missing_columns=[c.name for c in src_cols if lake_names and c.name not in lake_names],
    )


def compare_pipeline(pipeline: PipelineConfig, dsn: str) -> list[TableComparison]:
    from cdclake.kafka.topics import discover

    pipeline = discover(pipeline)
    cat = load_catalog(pipeline.catalog)
    return [
        compare_table(pipeline, t, dsn, cat, history)
        for t in pipeline.tables
        for history in ((False, True) if t.history else (False,))
    ]


def render_comparison(results: Iterable[TableComparison], max_rows: int = 12) -> str:
    """Each source table beside its lake table, then a verdict."""
    results = list(results)
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
            out.append(f"   {left:<{width}} | {right}")
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


def _fmt(row: tuple[Any, ...]) -> str:
    return ", ".join("NULL" if v is None else str(v) for v in row)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
