"""Debezium's JSON-converter values read by DuckDB (`from_json`), column by column: the SQL
that gives each field of a Connect schema its lake value and, for a value that does not
fit, the reason (`leaf`). A JSON value of another type than its field's is taken as DuckDB
converts it, when it converts (`1.5` into a bigint as 2, `"12"` as 12, `5` into text as
'5'); one that does not (`"one"` into a bigint, 2^40 into an int32) does not fit.

`changes_sql(checked=False)` reads the plainly typed fields (`_TYPED`) straight into their
SQL types with `from_json_strict`, which refuses a whole record when any value does not
convert (or a field is missing): such a record has a reason, and the caller reads its
batch again `checked`, each leaf as JSON text, for the reasons. Both give the same values.

Each type is decoded by one piece of code, here or in `json_values.decoder`. The types here
are those with a plain SQL form; arrays and maps keep their JSON text, and their items are
decoded by this same SQL in `json_decode.lake_values`; the others (times of day,
variable-scale decimals, geometries, structs) keep their JSON text too, decoded value by
value by `json_values.decoder`, each by the fields of its own value schema."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdclake.debezium.connect import (
    CONNECT_DATE,
    CONNECT_TIME,
    CONNECT_TIMESTAMP,
    DATE,
    DECIMAL,
    GEOGRAPHY,
    GEOMETRY,
    INFINITY_DAYS,
    INFINITY_MICROS,
    INFINITY_MILLIS,
    MICRO_TIME,
    MICRO_TIMESTAMP,
    NANO_TIME,
    NANO_TIMESTAMP,
    TIME,
    TIMESTAMP,
    VARIABLE_SCALE_DECIMAL,
    ZONED_TIMESTAMP,
    ConnectField,
    decimal_params,
)
from cdclake.debezium.json_flat import NO_OP

if TYPE_CHECKING:
    from cdclake.debezium.schema import Column, TopicSchema

# the lake's range (Spark's and Iceberg's), which ±infinity loads as
_MAX_DAY, _MIN_DAY = "DATE '9999-12-31'", "DATE '0001-01-01'"
_MAX_TS, _MIN_TS = "TIMESTAMP '9999-12-31 23:59:59.999999'", "TIMESTAMP '0001-01-01 00:00:00'"
_MAX_MICROS, _MIN_MICROS = 253402300799999999, -62135596800000000
_MAX_DAYS, _MIN_DAYS = 2932896, -719162
_INTEGERS = "('BIGINT', 'UBIGINT')"


@dataclass(frozen=True)
class Leaf:
    """A field's lake value (`value`, None: decoded in Python from the JSON text) and
    what is wrong with it (`error`: NULL when nothing is), as SQL over its JSON text."""

    value: str | None
    error: str


def _sql_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def leaf(f: ConnectField, x: str) -> Leaf:
    """The SQL of field `f` whose JSON text is the expression `x` (NULL: absent or null)."""
    name = _sql_text(repr(f.name))
    seen = f"json_type({x})"
    shown = (
        f"left(CASE {seen} WHEN 'VARCHAR' THEN '''' || ({x} ->> '$') || '''' "
        f"WHEN 'BOOLEAN' THEN CASE WHEN CAST({x} AS BOOLEAN) THEN 'True' ELSE 'False' END "
        f"ELSE CAST({x} AS VARCHAR) END, 60)"
    )  # a value as Python shows it (`repr`)

    def wrong(what: str, bad: str) -> str:
        return (
            f"CASE WHEN {x} IS NOT NULL AND {seen} <> 'NULL' AND coalesce({bad}, true) "
            f"THEN 'field ' || {name} || ': ' || {shown} || "
            f"{_sql_text(' is not ' + what)} END"
        )

    lg, kind = f.logical, f.type
    if lg not in _DECODED:  # e.g. io.debezium.data.Json: decoded as its Connect type
        lg = None
    if lg == DECIMAL:
        return _decimal(f, x, seen, wrong)
    if lg == ZONED_TIMESTAMP:
        text = f"({x} ->> '$')"
        value = (
            f"CASE {text} WHEN 'infinity' THEN {_MAX_TS}::TIMESTAMPTZ WHEN '-infinity' "
            f"THEN {_MIN_TS}::TIMESTAMPTZ ELSE TRY_CAST({text} AS TIMESTAMPTZ) "
            "END"
        )
        zoned = f"regexp_matches({text}, '(Z|[+-][0-9][0-9](:?[0-9][0-9])?)$')"
        bad = (
            f"{seen} <> 'VARCHAR' OR ({text} NOT IN ('infinity', '-infinity') AND "
            f"(NOT {zoned} OR {value} IS NULL))"
        )
        return Leaf(value, wrong("a timestamp with a time zone", bad))
    if lg in (DATE, CONNECT_DATE):
        days = f"TRY_CAST({x} AS BIGINT)"
        value = (
            f"CASE {days} WHEN {INFINITY_DAYS[0]} THEN {_MAX_DAY} WHEN {INFINITY_DAYS[1]} "
            f"THEN {_MIN_DAY} ELSE TRY(DATE '1970-01-01' + CAST({days} AS INTEGER)) "
            "END"
        )
        ok = f"{days} IN {INFINITY_DAYS} OR {days} BETWEEN {_MIN_DAYS} AND {_MAX_DAYS}"
        return Leaf(
            value, wrong("a date in the lake's range", f"{seen} NOT IN {_INTEGERS} OR NOT ({ok})")
        )
    if lg in (TIMESTAMP, CONNECT_TIMESTAMP, MICRO_TIMESTAMP, NANO_TIMESTAMP):
        return _timestamp(f, x, seen, wrong)
    if lg is not None:
        return Leaf(None, "NULL")
    if kind in _TYPED:  # as DuckDB converts a JSON value (`from_json_strict`, `_typed`)
        value = f"TRY_CAST({x} AS {_TYPED[kind]})"
        if kind == "string":  # a number's text as DuckDB writes a double's
            value = (
                f"CASE WHEN {seen} = 'DOUBLE' THEN CAST(CAST({x} AS DOUBLE) AS VARCHAR) "
                f"ELSE ({x} ->> '$') END"
            )
        return Leaf(value, wrong(_NAMES[kind], f"{value} IS NULL"))
    if kind in ("float32", "float"):  # beyond a 32-bit float's range: infinity
        number = f"TRY_CAST({x} AS DOUBLE)"
        value = (
            f"CAST(CASE WHEN abs({number}) > 3.4028234663852886e38 AND NOT "
            f"isinf({number}) THEN sign({number}) * 'inf'::DOUBLE ELSE {number} END AS "
            "FLOAT)"
        )
        return Leaf(value, wrong("a number", f"{number} IS NULL"))
    if kind == "bytes":
        value = f"TRY(from_base64({x} ->> '$'))"
        bad = f"{seen} <> 'VARCHAR' OR {value} IS NULL"
        return Leaf(value, wrong("base64 text", bad))
    return Leaf(None, "NULL")


# the logical types decoded as such, here or by `json_values.decoder` (others: as their
# Connect type)
_DECODED = frozenset(
    (
        DECIMAL,
        DATE,
        CONNECT_DATE,
        TIMESTAMP,
        CONNECT_TIMESTAMP,
        MICRO_TIMESTAMP,
        NANO_TIMESTAMP,
        ZONED_TIMESTAMP,
        TIME,
        CONNECT_TIME,
        MICRO_TIME,
        NANO_TIME,
        VARIABLE_SCALE_DECIMAL,
        GEOMETRY,
        GEOGRAPHY,
    )
)


def _decimal(f: ConnectField, x: str, seen: str, wrong: Callable[[str, str], str]) -> Leaf:
    """A decimal's unscaled value (HUGEINT; the lake decimal is its `decimal(p, s)` view):
    big-endian two's complement bytes in base64, times 10^-scale for a negative scale."""
    precision, _ = decimal_params(f)
    raw_scale = int(f.param("scale", "0") or 0)
    data = f"TRY(from_base64({x} ->> '$'))"
    n = f"octet_length({data})"
    unsigned = f"TRY_CAST('0x' || hex({data}) AS UHUGEINT)"
    mask = (
        f"CASE WHEN {n} >= 16 THEN ~CAST(0 AS UHUGEINT) "
        f"ELSE (CAST(1 AS UHUGEINT) << CAST(8 * {n} AS UHUGEINT)) - 1 END"
    )
    negative = f"TRY_CAST('0x' || left(hex({data}), 2) AS INTEGER) >= 128"
    signed = (
        f"CASE WHEN {n} = 0 THEN CAST(0 AS HUGEINT) WHEN {negative} THEN "
        f"-TRY_CAST(((~{unsigned}) & ({mask})) + 1 AS HUGEINT) "
        f"ELSE TRY_CAST({unsigned} AS HUGEINT) END"
    )
    if raw_scale < 0:
        signed = f"TRY(({signed}) * CAST({10**-raw_scale} AS HUGEINT))"
    fits = (
        f"abs({signed}) < CAST({10**precision} AS HUGEINT)"
        if precision < 38
        else f"abs({signed}) < CAST('{10**38}' AS UHUGEINT)"
    )
    bad = f"{seen} <> 'VARCHAR' OR {data} IS NULL OR {n} > 16 OR {signed} IS NULL"
    big = (
        f"CASE WHEN NOT ({fits}) THEN 'field ' || {_sql_text(repr(f.name))} || ': ' || "
        f"CAST({signed} AS VARCHAR) || 'E{-max(raw_scale, 0)} does not fit its decimal "
        "type' END"
    )
    return Leaf(signed, f"coalesce({wrong('a decimal', bad)}, {big})")


def _timestamp(f: ConnectField, x: str, seen: str, wrong: Callable[[str, str], str]) -> Leaf:
    """A timestamp of milli-, micro- or nanoseconds since the epoch (no time zone)."""
    lg = f.logical
    ticks = f"TRY_CAST({x} AS HUGEINT)"
    if lg == NANO_TIMESTAMP:
        micros, plus, minus = (
            f"(CASE WHEN {ticks} >= 0 THEN {ticks} // 1000 ELSE -((-{ticks} + 999) // 1000) END)",
            None,
            None,
        )
    elif lg == MICRO_TIMESTAMP:
        micros, (plus, minus) = ticks, INFINITY_MICROS
    else:
        micros, (plus, minus) = f"({ticks} * 1000)", INFINITY_MILLIS
    ranged = f"{micros} BETWEEN {_MIN_MICROS} AND {_MAX_MICROS}"
    value = f"TRY(make_timestamp(TRY_CAST({micros} AS BIGINT)))"
    if plus is not None:
        value = (
            f"CASE {ticks} WHEN {plus} THEN {_MAX_TS} WHEN {minus} THEN {_MIN_TS} ELSE {value} END"
        )
        ranged = f"{ticks} IN ({plus}, {minus}) OR {ranged}"
    bad = (
        f"{seen} NOT IN {_INTEGERS} OR NOT ({ticks} BETWEEN {-(2**63)} AND {2**63 - 1}) "
        f"OR NOT ({ranged})"
    )
    return Leaf(value, wrong("a timestamp in the lake's range", bad))


ROW_SIDES = ("after", "before")


# the Connect types read as DuckDB converts a JSON value into their SQL type: a value of
# another JSON type is taken when it converts (`1.5` into a bigint as 2, `"12"` as 12, `5`
# into text as '5'), else it does not fit
_TYPED = {
    "int8": "INTEGER",
    "int16": "INTEGER",
    "int32": "INTEGER",
    "int64": "BIGINT",
    "float64": "DOUBLE",
    "double": "DOUBLE",
    "boolean": "BOOLEAN",
    "string": "VARCHAR",
}


_NAMES = {
    "int8": "a int8",
    "int16": "a int16",
    "int32": "a int32",
    "int64": "a int64",
    "float64": "a number",
    "double": "a number",
    "boolean": "a boolean",
    "string": "text",
}


def _typed(f: ConnectField) -> str | None:
    """The DuckDB type a field is read as when its JSON type goes unchecked (None: as
    JSON)."""
    return _TYPED.get(f.type) if f.logical not in _DECODED else None


def _row_spec(
    by_name: Mapping[str, ConnectField],
    columns: Sequence[Column],
    checked: bool,
    more: Sequence[str] = (),
) -> str:
    """A row's `from_json` structure: each column of the row's schema as JSON text, or
    unchecked its SQL type where it has one (`_typed`), then the fields `more` as JSON."""
    kinds = [
        f'"{c.name}":"{(not checked and _typed(by_name[c.name])) or "JSON"}"'
        for c in columns
        if c.name in by_name
    ]
    kinds += [f'"{m}":"JSON"' for m in more]
    return "{" + ",".join(kinds) + "}" if kinds else '"JSON"'  # none DuckDB can name


def _row_values(
    by_name: Mapping[str, ConnectField], columns: Sequence[Column], at: str, checked: bool
) -> tuple[list[tuple[str, str]], list[str]]:
    """Each column's (name, lake value) over a row read at `at` (NULL for a column the
    row's schema lacks), and the checks of its values; unchecked, a plainly typed field is
    its value as read (`from_json_strict` converted it)."""
    values: list[tuple[str, str]] = []
    checks: list[str] = []
    for c in columns:
        f = by_name.get(c.name)
        x = f'{at}"{c.name}"'
        if f is None:
            values.append((c.name, "NULL"))
        elif not checked and _typed(f):
            values.append((c.name, x))
        else:
            got = leaf(f, x)
            values.append((c.name, got.value or f"CAST({x} AS VARCHAR)"))
            checks.append(got.error)
    return values, checks


def event_parts(
    fields: Sequence[ConnectField], columns: Sequence[Column], checked: bool = True
) -> tuple[str, list[str], list[str]]:
    """A change event's `from_json` structure, and over it (`e`) the expressions of its
    operation, source time, LSN and both sides' columns (`after__<name>`,
    `before__<name>`: the lake value, or its JSON text where `leaf` leaves it to
    Python), and those of what can be wrong with it."""
    by_name = {f.name: f for f in fields}
    row = _row_spec(by_name, columns, checked)
    spec = (
        '{"op":"JSON","source":{"ts_ms":"JSON","lsn":"JSON"},"after":'
        + row
        + ',"before":'
        + row
        + "}"
    )
    picked = ["e.op ->> '$' AS op", "e.after IS NOT NULL AS has_after"]
    errors = [
        "CASE WHEN e IS NOT NULL AND (json_type(e.op) IS DISTINCT FROM 'VARCHAR' OR "
        "(e.op ->> '$') NOT IN ('c', 'u', 'd', 'r', 't')) THEN 'unknown operation ' || "
        "coalesce(e.op ->> '$', 'None') END"
    ]
    for name in ("ts_ms", "lsn"):
        x = f"e.source.{name}"
        picked.append(f"TRY_CAST({x} AS BIGINT) AS {name}")
        errors.append(
            f"CASE WHEN {x} IS NOT NULL AND json_type({x}) NOT IN {_INTEGERS} THEN "
            f"'source.{name} is not an integer' END"
        )
    for side in ROW_SIDES:
        values, checks = _row_values(by_name, columns, f"e.{side}.", checked)
        picked += [f'{v} AS "{side}__{name}"' for name, v in values]
        errors += checks
    return spec, picked, errors


def key_parts(
    fields: Sequence[ConnectField], key: Sequence[Column], at: str = "k"
) -> tuple[str, list[str], list[str]]:
    """A key's `from_json` structure, and over it (`at`) its columns' value expressions
    (in the order of `key`) and those of what can be wrong with them."""
    by_name = {f.name: f for f in fields}
    values, errors = _row_values(by_name, key, f"{at}.", True)
    errors = [e.replace("'field ", "'key field ", 1) for e in errors]
    return _row_spec(by_name, key, True), [v for _, v in values], errors


def old_key_parts(
    fields: Sequence[ConnectField], key: Sequence[Column], op: str = "(e.op ->> '$')"
) -> tuple[list[str], list[str]]:
    """The key a create was changed from (its `__debezium.oldkey` header, parsed as `o`:
    a primary-key change) as columns `from__<name>` (NULL unless the change is a create
    and every key column has a value), and what can be wrong with it."""
    _, values, errors = key_parts(fields, key, "o")
    create = f"({op}) = 'c' AND oldkey IS NOT NULL"
    whole = " AND ".join(f"({v}) IS NOT NULL" for v in values)
    columns = [
        f'CASE WHEN {create} AND {whole} THEN {v} END AS "from__{c.name}"'
        for v, c in zip(values, key, strict=True)
    ]
    checks = [
        f"CASE WHEN {create} AND json_type(o_json) IS DISTINCT FROM 'OBJECT' THEN "
        "'header __debezium.oldkey is not a key: ' || left(oldkey, 60) END"
    ]
    checks += [f"CASE WHEN {create} THEN {err} END" for err in errors]
    return columns, checks


_OLD_KEY = "json_extract_string(headers, '$.\"__debezium.oldkey\"')"
_NEW_KEY = "json_extract_string(headers, '$.\"__debezium.newkey\"')"
# the key as the JSON converter writes it (schema and payload), or its payload alone
_OLD_KEY_JSON = (
    "CASE WHEN json_exists(oldkey, '$.schema') AND json_exists(oldkey, '$.payload')"
    " THEN json_extract(oldkey, '$.payload') ELSE TRY(CAST(oldkey AS JSON)) END"
)


def flat_parts(
    fields: Sequence[ConnectField],
    columns: Sequence[Column],
    meta: frozenset[str],
    deletes: bool,
    checked: bool = True,
) -> tuple[str, list[str], list[str], str, list[str], str]:
    """`event_parts` of a row flattened by ExtractNewRecordState (`json_flat`): `e` is the
    row, `meta` the transform's fields its schema has (`__op`, `__lsn`, ...), and their
    headers stand in for missing ones; a null payload, and with `deletes` a tombstone,
    is the delete of its key. Also gives the tombstone flag and the broken-record checks."""
    by_name = {f.name: f for f in fields}
    spec = _row_spec(by_name, columns, checked, sorted(meta))

    def given(name: str) -> str:  # the field, else the header (text, or a JSON envelope)
        head = f"json_extract_string(headers, '$.\"{name}\"')"
        head = (
            f"CASE WHEN starts_with({head}, '{{') THEN json_extract_string({head}, "
            f"'$.payload') ELSE {head} END"
        )
        return f"coalesce(e.\"{name}\" ->> '$', {head})" if name in meta else head

    null_row = "json_type(value_payload) = 'NULL'"
    gone = "'d'" if deletes else "NULL"  # a tombstone
    op = (
        f"CASE WHEN value_payload IS NULL THEN {gone} "
        f"WHEN {null_row} THEN 'd' ELSE {given('__op')} END"
    )
    picked = [f"{op} AS op", f"({op}) IS DISTINCT FROM 'd' AND e IS NOT NULL AS has_after"]
    errors = [
        f"CASE WHEN value_payload IS NOT NULL AND NOT {null_row} AND ({op}) IS NULL "
        f"THEN {_sql_text('record ' + NO_OP)} END",
        f"CASE WHEN ({op}) NOT IN ('c', 'u', 'd', 'r', 't') THEN 'unknown operation ' || "
        f"({op}) END",
    ]
    for name, out in (("__source_ts_ms", "ts_ms"), ("__lsn", "lsn")):
        text = given(name)
        picked.append(f"TRY_CAST({text} AS BIGINT) AS {out}")
        errors.append(
            f"CASE WHEN {text} IS NOT NULL AND TRY_CAST({text} AS BIGINT) IS NULL "
            f"THEN '{name} is not an integer: ' || {_sql_text(chr(39))} || "
            f"left({text}, 40) || {_sql_text(chr(39))} END"
        )
    values, checks = _row_values(by_name, columns, "e.", checked)
    for side, when in (("after", "<>"), ("before", "=")):
        picked += [
            f"CASE WHEN ({op}) {when} 'd' THEN {v} END AS \"{side}__{name}\"" for name, v in values
        ]
    errors += checks
    tombstone = "is_tombstone AND value_payload IS NULL" if not deletes else "false"
    broken = [
        "CASE WHEN e IS NULL AND value_payload IS NOT NULL AND NOT "
        f"{null_row} THEN CASE WHEN json_type(value_payload) <> 'OBJECT' THEN 'value is "
        "not a flattened row' ELSE 'the payload is not a row of its schema' END END"
    ]
    return spec, picked, errors, tombstone, broken, op


def changes_sql(
    key_fields: Sequence[ConnectField],
    value_fields: Sequence[ConnectField],
    schema: TopicSchema,
    source: str = "raw",
    checked: bool = True,
    flat: tuple[frozenset[str], bool] | None = None,
) -> str:
    """A query over the raw rows `source` of one key and one value schema: per record,
    its position, tombstone flag, key columns, operation, source time and LSN, both
    sides' columns, the key a create was changed from and `reason`, what is wrong with
    it first (NULL: nothing). `flat`: the records are rows flattened by
    ExtractNewRecordState, with these metadata fields and whether a tombstone is a delete
    (`flat_parts`)."""
    if flat is None:
        value_spec, values, value_errors = event_parts(value_fields, schema.columns, checked)
        tombstone, op = "is_tombstone", "(e.op ->> '$')"
        broken = [
            "CASE WHEN value_payload IS NOT NULL AND (e IS NULL OR e.op IS NULL) THEN "
            "CASE WHEN json_type(value_payload) IS DISTINCT FROM 'OBJECT' THEN 'value is "
            "not a Debezium envelope matching its schema' WHEN e IS NULL THEN 'the "
            "payload is not a change event of its schema' END END"
        ]
    else:
        value_spec, values, value_errors, tombstone, broken, op = flat_parts(
            value_fields, schema.columns, *flat, checked
        )
    key_spec, keys, key_errors = key_parts(key_fields, schema.key)
    keys = [f'{v} AS "key__{c.name}"' for v, c in zip(keys, schema.key, strict=True)]
    olds, old_errors = old_key_parts(key_fields, schema.key, op)
    broken = [
        "CASE WHEN k IS NULL AND key_payload IS NOT NULL THEN 'the key is not JSON "
        "of its schema' END",
        *broken,
    ]
    query = (
        f'SELECT partition, "offset", {tombstone} AS is_tombstone, follows_gap, '
        f"{', '.join([*keys, *values, *olds])}, CASE ({op}) WHEN 'd' THEN {_NEW_KEY} IS NOT "
        "NULL WHEN 'c' THEN oldkey IS NOT NULL ELSE false END AS moved, "
        f"coalesce({', '.join([*broken, *key_errors, *value_errors, *old_errors])}) "
        f"AS reason FROM (SELECT *, TRY(from_json(o_json, '{key_spec}')) AS o FROM "
        f"(SELECT *, {_OLD_KEY_JSON} AS o_json FROM "
        f'(SELECT partition, "offset", is_tombstone, follows_gap, key_payload, value_payload, '
        f"headers, "
        f"{_OLD_KEY} AS oldkey, "
        f"TRY(from_json(key_payload, '{key_spec}')) AS k, "
        f"TRY({'from_json' if checked else 'from_json_strict'}(value_payload, "
        f"'{value_spec}')) AS e FROM {source})))"
    )
    if not schema.key_names:
        return query
    keyless = " AND ".join(
        f'"{side}__{k}" IS NULL' for k in schema.key_names for side in ("key", "after", "before")
    )
    return (
        f"SELECT * REPLACE (coalesce(reason, CASE WHEN NOT is_tombstone AND op IS "
        f"DISTINCT FROM 't' AND {keyless} THEN 'record has no key' END) AS reason) "
        f"FROM ({query})"
    )
