"""Snapshot filters: parsed with PostgreSQL's grammar, only read-only expressions pass.

CATALOG is what pg_proc of PostgreSQL 15 (the local stack) says about the functions below
(every overload of the name); the integration tests ask a real source database."""

import pytest
from cdclake_control.snapshot_filter import (
    MAX_FILTER_CHARS,
    FilterError,
    FunctionInfo,
    Volatility,
    check_functions,
    filter_seconds,
    filter_sql,
    parse_filter,
)

IMM, S, V = Volatility.IMMUTABLE, Volatility.STABLE, Volatility.VOLATILE
CATALOG = {
    "lower": FunctionInfo(IMM, returns_set=False, plain=True),
    "pg_catalog.lower": FunctionInfo(IMM, returns_set=False, plain=True),
    "abs": FunctionInfo(IMM, returns_set=False, plain=True),
    "nextval": FunctionInfo(V, returns_set=False, plain=True),
    "lo_from_bytea": FunctionInfo(V, returns_set=False, plain=True),
    "pg_sleep": FunctionInfo(V, returns_set=False, plain=True),
    "random": FunctionInfo(V, returns_set=False, plain=True),
    "now": FunctionInfo(S, returns_set=False, plain=True),
    "date_trunc": FunctionInfo(S, returns_set=False, plain=True),  # timestamptz overloads
    "generate_series": FunctionInfo(S, returns_set=True, plain=True),  # timestamptz: stable
    "max": FunctionInfo(IMM, returns_set=False, plain=False),
    "no_such_function": None,
}

FILTERS = [
    # accepted: read-only expressions
    ("quantity > 1", None),
    ("a = 1 or b = 2", None),  # sent in parentheses: Debezium's AND binds it whole
    ("code = 'it''s' or code is null", None),
    ("note = 'a;b -- c /* d */'", None),  # separators and comments inside a literal
    ("id between 10 and 20 and not (v is not null)", None),
    ("id in (1, 2, 3) and status like 'new%' and name ilike 'a%'", None),
    ("x is distinct from y and flag is true", None),
    ("v * 2 + 1 >= -3 / 4.5 and v % 2 = 0 and 'a' || name <> 'b'", None),
    ("placed_at >= '2026-01-01'::timestamptz and d < date '2026-02-01'", None),
    ("amount::numeric(10, 2) > 3 and code::varchar(3) = 'x' and tags::text[] = '{}'", None),
    ("lower(name) = 'sally' and abs(v) < 5 and pg_catalog.lower(email) like '%.com'", None),
    ("coalesce(a, b) = 1 and greatest(a, b) < 9 and nullif(a, 0) > 1", None),
    ("case when v > 1 then true else false end", None),
    ("(a, b) > (1, 2) and v = any(array[1, 2])", None),
    ("orders.quantity > 1", None),
    ("true", None),
    ("(quantity > 1)", None),
    # refused: functions that are not immutable, or not plain functions
    ("id = nextval('inventory.orders_seq')", "nextval(), which PostgreSQL marks volatile"),
    ("lo_from_bytea(0, 'x') > 0", "lo_from_bytea(), which PostgreSQL marks volatile"),
    ("pg_sleep(10) is null", "pg_sleep(), which PostgreSQL marks volatile"),
    ("random() < 0.5", "random(), which PostgreSQL marks volatile"),
    ("placed_at > now()", "now(), which PostgreSQL marks stable"),
    ("date_trunc('day', placed_at) = d", "date_trunc(), which PostgreSQL marks stable"),
    ("generate_series(1, 3) = id", "generate_series(), which is a set-returning function"),
    ("no_such_function(id)", "no_such_function(), which is not a function of the source"),
    ("max(id) > 1", "max(), which is not a plain function"),
    ("\"Lower\"(name) = 'a'", "Lower(), which is not a function"),  # quoted: case kept
    ("LOWER(name) = 'a'", None),  # unquoted: folded to lower
    ('"a.b"(name) = 1', "give a function as name or schema.name"),
    ("count(*) > 1", "count() as an aggregate or window function"),
    ("row_number() over () > 1", "row_number() as an aggregate or window function"),
    # refused: anything but one read-only expression
    ("id in (select id from inventory.customers)", "subquery"),
    ("exists (select 1)", "subquery"),
    ("id = (select max(id) from t)", "subquery"),
    ("placed_at > current_date", "session value"),
    ("owner = current_user", "session value"),
    ("id = $1", "parameter"),
    ("id > 1; delete from inventory.orders", "statement separators"),
    ("id > 1 -- all", "comments"),
    ("id > 1 /* x */", "comments"),
    ("id > 1) or (1 = 1", "not a valid condition: syntax error"),
    ("id > 1 order by id", "one condition"),
    ("id > 1 limit 1", "one condition"),
    ("id > 1 union select 1", "one condition"),
    ("id > 1 for update", "one condition"),
    ("id >", "not a valid condition"),
    ("   ", "empty"),
    ("name ~ 'a.*'", "operator ~"),
    ("doc @> '{}'", "operator @>"),
    ("a OPERATOR(public.=) 1", "operator public.="),
    ("name similar to 'a%'", "SIMILAR"),
    ("id::regclass is not null", "cast to regclass"),
    ("v::public.evil > 1", "cast to public.evil"),
    ("a.b.c.d = 1", "`column` or `table.column`"),
    ("id > 1" + " and id > 1" * (MAX_FILTER_CHARS // 10), f"at most {MAX_FILTER_CHARS:,}"),
]


@pytest.mark.parametrize(("condition", "refusal"), FILTERS)
def test_filters_can_only_read(condition, refusal):
    if refusal is None:
        check_functions("s.t", parse_filter("s.t", condition), CATALOG)
        return
    with pytest.raises(FilterError, match=_escape(refusal)):
        check_functions("s.t", parse_filter("s.t", condition), CATALOG)


def test_a_filter_is_sent_in_parentheses():
    assert filter_sql("  a = 1 or b = 2 ") == "(a = 1 or b = 2)"


def _escape(text: str) -> str:
    import re

    return re.escape(text)


@pytest.mark.parametrize(
    "plan_s, run_s, sampled, rows, expected",
    [
        (0.001, 0.0002, 20, 10_240, 0.01 + 0.1024),  # planned once per chunk of 1,024 rows
        (0.15, 0.0, 20, 1_000, 0.15),  # a constant computed while planning, one chunk
        (0.0, 2.0, 20, 1_000_000, 100_000.0),  # 0.1 s a row, scaled to every row
        (0.002, 0.001, 0, 0, 0.003),  # an empty table: one chunk, the run as measured
    ],
)
def test_a_filters_cost_is_its_planning_per_chunk_and_its_run_per_row(
    plan_s, run_s, sampled, rows, expected
):
    assert filter_seconds(plan_s, run_s, sampled, rows) == pytest.approx(expected)
