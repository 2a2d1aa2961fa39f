"""Snapshot filters that can only read.

Debezium runs a filter (`additional-conditions`) in the source database as the
connector's user, pasted into its chunk query: `SELECT ... FROM t WHERE <bounds> AND
<filter> ORDER BY <key> LIMIT n`. So a filter is parsed here with PostgreSQL's own grammar
(pglast, libpg_query) and only a closed set of expressions passes: column references,
literals and casts of them to plain types, comparison, arithmetic and boolean operators,
IS [NOT] NULL, IS [NOT] DISTINCT FROM, IN, BETWEEN, LIKE/ILIKE, CASE, COALESCE,
GREATEST/LEAST, arrays, and calls of functions that PostgreSQL marks immutable (every
overload of the name, in the source database's pg_proc). Subqueries, parameters,
`CURRENT_DATE`-style values and anything else are refused with the construct named; a
refused function is named.

The filter is sent in parentheses, so Debezium's `AND` binds it whole (`a OR b` would
otherwise escape the chunk's bounds). Comments and statement separators are refused even
where the grammar would accept them: a filter is one expression.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, cast

from cdclake.exceptions import CdclakeError, first_line

if TYPE_CHECKING:
    import psycopg

# a pglast parse tree node (its attributes are the node type's)
Node = Any

# Debezium keeps every filter of a running incremental snapshot in the connector's offsets
# (`incremental_snapshot_collections`), stored with each snapshot record; cdclake caps a
# filter so those stay small. The signal table's `data` column may hold less: checked
# against the source database when a signal is sent (see signals.check_source).
MAX_FILTER_CHARS = 4096
MAX_FILTER_DEPTH = 64  # nesting of expressions: libpg_query's stack is not ours to test
# a filter's cost is measured on this many of the table's rows; Debezium plans its chunk
# query, filter included, once for each `incremental.snapshot.chunk.size` rows (its default)
SAMPLE_ROWS = 20
CHUNK_ROWS = 1024


class FilterError(CdclakeError):
    """A snapshot filter that must not be sent."""


class Volatility(StrEnum):
    """pg_proc.provolatile."""

    IMMUTABLE = "i"
    STABLE = "s"
    VOLATILE = "v"


@dataclass(frozen=True)
class FunctionInfo:
    """What the source database's pg_proc says about every overload of one name."""

    volatility: Volatility  # the least safe overload's
    returns_set: bool  # an overload is set-returning
    plain: bool  # every overload is a plain function (not an aggregate, window, procedure)


@dataclass(frozen=True)
class ParsedFilter:
    text: str  # as given, stripped
    functions: tuple[str, ...]  # names called, `name` or `schema.name`, as PostgreSQL reads them


def filter_sql(condition: str) -> str:
    """A checked condition as sent to Debezium: parenthesized, so its AND binds it whole."""
    return f"({condition.strip()})"


# operators by symbol (resolved in pg_catalog for the built-in types)
COMPARISON = frozenset({"=", "<>", "!=", "<", ">", "<=", ">="})
ARITHMETIC = frozenset({"+", "-", "*", "/", "%", "^", "||"})
# casts to these only: their input functions are the built-in, immutable ones
PLAIN_TYPES = frozenset(
    "bool int2 int4 int8 numeric float4 float8 money text varchar bpchar char name date time "
    "timetz timestamp timestamptz interval uuid bytea json jsonb inet cidr macaddr macaddr8 "
    "bit varbit".split()
)
_PLAIN_EXPR_KINDS = frozenset(
    {
        "AEXPR_OP",
        "AEXPR_OP_ANY",
        "AEXPR_OP_ALL",
        "AEXPR_DISTINCT",
        "AEXPR_NOT_DISTINCT",
        "AEXPR_NULLIF",
        "AEXPR_IN",
        "AEXPR_LIKE",
        "AEXPR_ILIKE",
        "AEXPR_BETWEEN",
        "AEXPR_NOT_BETWEEN",
        "AEXPR_BETWEEN_SYM",
        "AEXPR_NOT_BETWEEN_SYM",
    }
)
_LIKE_OPS = frozenset({"~~", "!~~", "~~*", "!~~*"})
# nodes whose children are all expressions checked by the same rules
_COMPOSITE = frozenset(
    {
        "BoolExpr",
        "NullTest",
        "BooleanTest",
        "CoalesceExpr",
        "MinMaxExpr",
        "CaseExpr",
        "CaseWhen",
        "A_ArrayExpr",
        "RowExpr",
        "A_Indirection",
        "A_Indices",
    }
)
_REFUSED = {
    "SubLink": "a subquery",
    "ParamRef": "a parameter ($n)",
    "SQLValueFunction": "a session value such as CURRENT_DATE or CURRENT_USER (not immutable)",
    "A_Star": "*",
    "GroupingFunc": "GROUPING",
    "XmlExpr": "an XML expression",
    "XmlSerialize": "an XML expression",
}


def parse_filter(table: str, condition: str) -> ParsedFilter:
    """Parse one condition and refuse anything but the read-only expressions above; the
    functions it calls are checked against the source database by `check_functions`."""
    text = condition.strip()
    if not text:
        raise FilterError(f"filter for {table!r} is empty")
    if len(text) > MAX_FILTER_CHARS:
        raise FilterError(
            f"filter for {table!r} is {len(text):,} characters; at most {MAX_FILTER_CHARS:,} "
            "are sent (Debezium stores each filter in the connector's offsets)"
        )
    _check_tokens(table, text)
    where = _parse(table, text)
    functions: list[str] = []
    for node, depth in _walk(where, 0):
        if depth > MAX_FILTER_DEPTH:
            raise FilterError(f"filter for {table!r} nests deeper than {MAX_FILTER_DEPTH} levels")
        name = _check_node(table, node)
        if name:
            functions.append(name)
    return ParsedFilter(text, tuple(dict.fromkeys(functions)))


def check_functions(
    table: str, parsed: ParsedFilter, catalog: Mapping[str, FunctionInfo | None]
) -> None:
    """Refuse a filter calling a function that is not immutable for every argument type,
    returns a set, is not a plain function, or does not exist. `catalog` maps each name of
    `parsed.functions` to what pg_proc says (see `read_functions`)."""
    for name in parsed.functions:
        info = catalog.get(name)
        if info is None:
            raise FilterError(
                f"filter for {table!r} calls {name}(), which is not a function of the source "
                "database"
            )
        if not info.plain or info.returns_set:
            what = "a set-returning function" if info.returns_set else "not a plain function"
            raise FilterError(f"filter for {table!r} calls {name}(), which is {what}")
        if info.volatility is not Volatility.IMMUTABLE:
            raise FilterError(
                f"filter for {table!r} calls {name}(), which PostgreSQL marks "
                f"{info.volatility.name.lower()} (only immutable functions may be called: a "
                "filter runs in the source database as the connector's user)"
            )


def check_in_source(
    conn: psycopg.Connection[Any], table: str, condition: str, max_seconds: float
) -> float:
    """The whole check against the source database (`conn` in a read-only transaction):
    functions first, so nothing is run that calls one not immutable, then the condition
    run on the table's first `SAMPLE_ROWS` rows (EXPLAIN ANALYZE, in a savepoint), whose
    planning and run give what it would cost the source (`filter_seconds`), refused over
    `max_seconds`. Returns that estimate. A statement timeout (QueryCanceled) is raised as
    it is."""
    import psycopg
    from psycopg import sql

    parsed = parse_filter(table, condition)
    check_functions(table, parsed, read_functions(conn, parsed.functions))
    schema, name = table.split(".", 1)
    relation = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))
    statement = sql.SQL(
        "EXPLAIN (ANALYZE, FORMAT JSON) SELECT 1 FROM (SELECT * FROM {} LIMIT {}) AS sample "
        "WHERE {}"
    ).format(relation, sql.Literal(SAMPLE_ROWS), sql.SQL(filter_sql(condition)))
    try:
        with conn.transaction():
            [[found]] = conn.execute(statement).fetchall()
            rows = cast(  # the table's row: the sample read it
                "tuple[Any, ...]",
                conn.execute(
                    sql.SQL("SELECT reltuples FROM pg_class WHERE oid = {}::regclass").format(
                        sql.Literal(f"{schema}.{name}")
                    )
                ).fetchone(),
            )[0]
    except psycopg.errors.QueryCanceled:
        raise
    except psycopg.Error as exc:
        first = first_line(exc)
        raise FilterError(f"filter for {table!r} is not a valid condition: {first}") from None
    plan = found[0]
    sampled = plan["Plan"]["Plans"][0]["Actual Rows"] if plan["Plan"].get("Plans") else 0
    rows = max(rows, sampled)  # reltuples is an estimate (-1 before the first ANALYZE)
    seconds = filter_seconds(
        plan["Planning Time"] / 1e3, plan["Execution Time"] / 1e3, sampled, rows
    )
    if seconds > max_seconds:
        raise FilterError(
            f"filter for {table!r} would cost the source database about {seconds:,.0f} s "
            f"(planned {plan['Planning Time']:.1f} ms for each chunk of {CHUNK_ROWS:,} rows, "
            f"run {plan['Execution Time']:.1f} ms on {sampled} of ~{rows:,.0f} "
            f"rows), over source.filter_max_seconds ({max_seconds:g} s): filter on plain "
            "columns, or raise the setting"
        )
    return seconds


def filter_seconds(plan_s: float, run_s: float, sampled: int, rows: float) -> float:
    """What a filter costs the source over an incremental snapshot of `rows` rows: its
    planning once for each chunk Debezium reads (a constant expression such as
    `md5(repeat('x', 50000000))` is computed while planning), and its run on `sampled`
    rows scaled to all of them."""
    chunks = max(1, math.ceil(rows / CHUNK_ROWS))
    return plan_s * chunks + (run_s / sampled * rows if sampled else run_s)


def read_functions(
    conn: psycopg.Connection[Any], names: tuple[str, ...]
) -> dict[str, FunctionInfo | None]:
    """What pg_proc says about each name: `schema.name` looks in that schema, a bare name
    in every schema (the connector's search_path is not known here), so a name is
    immutable only when every function of that name is."""
    found: dict[str, FunctionInfo | None] = {}
    for name in names:
        schema, _, proname = name.rpartition(".")
        rows = conn.execute(
            "SELECT p.provolatile, p.proretset, p.prokind FROM pg_catalog.pg_proc p "
            "JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace "
            "WHERE p.proname = %s AND (%s = '' OR n.nspname = %s)",
            (proname, schema, schema),
        ).fetchall()
        if not rows:
            found[name] = None
            continue
        order = [Volatility.IMMUTABLE, Volatility.STABLE, Volatility.VOLATILE]
        worst = max((Volatility(r[0]) for r in rows), key=order.index)
        found[name] = FunctionInfo(
            volatility=worst,
            returns_set=any(bool(r[1]) for r in rows),
            plain=all(r[2] == "f" for r in rows),
        )
    return found


def _check_tokens(table: str, text: str) -> None:
    from pglast import parser

    try:
        tokens = parser.scan(text)
    except parser.ParseError as exc:
        raise FilterError(f"filter for {table!r} is not valid SQL: {exc}") from None
    for token in tokens:
        if token.name in ("SQL_COMMENT", "C_COMMENT"):
            raise FilterError(f"filter for {table!r} may not contain comments")
        if token.name == "ASCII_59":
            raise FilterError(f"filter for {table!r} may not contain statement separators (;)")


def _parse(table: str, text: str) -> Node:
    """The WHERE expression of `SELECT WHERE <text>`; the text must be the whole of it,
    alone or in parentheses the same expression (nothing escapes or follows it)."""
    from pglast import parse_sql, parser

    def where_of(sql: str) -> Node | None:
        stmts = parse_sql(sql)
        stmt: Node = stmts[0].stmt if len(stmts) == 1 else None
        if type(stmt).__name__ != "SelectStmt" or stmt.whereClause is None:
            return None
        extra = (
            "fromClause",
            "groupClause",
            "havingClause",
            "sortClause",
            "limitCount",
            "limitOffset",
            "lockingClause",
            "withClause",
            "windowClause",
            "larg",
            "valuesLists",
            "distinctClause",
            "intoClause",
        )
        if any(getattr(stmt, f, None) for f in extra) or len(stmt.targetList or ()) != 1:
            return None
        return stmt.whereClause

    head = "SELECT 1 WHERE "
    try:
        bare = where_of(head + text)
    except parser.ParseError as exc:
        message, at = (list(exc.args) + [None, None])[:2]
        where = f" (character {at - len(head) + 1})" if isinstance(at, int) else ""
        raise FilterError(
            f"filter for {table!r} is not a valid condition: {message}{where}"
        ) from None
    try:
        wrapped = where_of(f"SELECT 1 WHERE ({text}\n)")
    except parser.ParseError:
        wrapped = None
    if bare is None or wrapped is None or bare != wrapped:
        raise FilterError(
            f"filter for {table!r} must be one condition (a WHERE expression), with no "
            "clauses or statements after it"
        )
    return bare


def _walk(node: Node, depth: int) -> Iterator[tuple[object, int]]:
    """Every expression node under `node`, with its depth; names, type names and
    constants' values are not walked into (they are checked where they are)."""
    from pglast import ast

    if isinstance(node, tuple):
        for item in node:
            yield from _walk(item, depth)
        return
    if not isinstance(node, ast.Node):
        return
    yield node, depth
    kind = type(node).__name__
    if kind in ("A_Const", "ColumnRef", "String"):
        return
    skip = {
        "FuncCall": {"funcname"},
        "A_Expr": {"name"},
        "TypeCast": {"typeName"},
        "CollateClause": {"collname"},
    }.get(kind, set())
    for attr in node:
        if attr in skip:
            continue
        value = getattr(node, attr)
        if isinstance(value, ast.Node | tuple):
            yield from _walk(value, depth + 1)


def _check_node(table: str, node: Node) -> str | None:
    """Refuse a node outside the read-only set; the function name of a call."""
    kind = type(node).__name__
    where = f"filter for {table!r}"
    if kind in _REFUSED:
        raise FilterError(f"{where} may not contain {_REFUSED[kind]}")
    if kind in _COMPOSITE or kind == "A_Const":
        return None
    if kind == "String":  # a field name in A_Indirection ((col).field)
        return None
    if kind == "ColumnRef":
        if len(node.fields) > 2 or type(node.fields[-1]).__name__ != "String":
            raise FilterError(f"{where}: a column is named `column` or `table.column`")
        return None
    if kind == "A_Expr":
        _check_operator(where, node)
        return None
    if kind == "TypeCast":
        _check_type(where, node.typeName)
        return None
    if kind == "CollateClause":
        return None
    if kind == "FuncCall":
        return _function_name(where, node)
    raise FilterError(f"{where} may not contain {kind} (not a read-only expression cdclake knows)")


def _check_operator(where: str, node: Node) -> None:
    kind = node.kind.name
    if kind not in _PLAIN_EXPR_KINDS:
        raise FilterError(f"{where} may not use {kind.removeprefix('AEXPR_').replace('_', ' ')}")
    if kind in ("AEXPR_IN", "AEXPR_NULLIF") or "BETWEEN" in kind:
        return
    names = [n.sval for n in node.name]
    if len(names) == 2 and names[0] != "pg_catalog" or len(names) > 2:
        raise FilterError(f"{where} may not use operator {'.'.join(names)}")
    symbol = names[-1]
    allowed = _LIKE_OPS if kind in ("AEXPR_LIKE", "AEXPR_ILIKE") else COMPARISON | ARITHMETIC
    if symbol not in allowed:
        raise FilterError(
            f"{where} may not use operator {symbol} (comparison, arithmetic, ||, LIKE only)"
        )


def _check_type(where: str, type_name: Node) -> None:
    names = [n.sval for n in type_name.names]
    qualifier_ok = len(names) == 1 or (len(names) == 2 and names[0] == "pg_catalog")
    if not qualifier_ok or names[-1] not in PLAIN_TYPES or type_name.pct_type or type_name.setof:
        raise FilterError(
            f"{where} may not cast to {'.'.join(names)} (plain built-in types only: "
            "numbers, text, dates and times, bool, uuid, json, ...)"
        )


def _function_name(where: str, node: Node) -> str:
    names = [n.sval for n in node.funcname]  # unquoted names come folded to lower case
    name = ".".join(names)
    if node.over is not None or node.agg_star or node.agg_distinct or node.agg_filter:
        raise FilterError(f"{where} may not call {name}() as an aggregate or window function")
    if node.agg_order or node.agg_within_group or node.func_variadic:
        raise FilterError(f"{where} may not call {name}() with ORDER BY or VARIADIC")
    if len(names) > 2 or any("." in n for n in names):
        raise FilterError(f"{where} calls {name}(): give a function as name or schema.name")
    return name
