"""Raw rows of one topic as a table of changes: `json_sql`'s queries run by DuckDB over
the payload texts, each run of one (key, value) schema pair by its own query; the values
it leaves as JSON text (arrays, maps and the types `json_sql.leaf` has no SQL for) decoded
in `lake_values`, each type by one piece of code: its SQL, or `json_values.decoder`."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cdclake.debezium.connect import DECIMAL, arrow_type, parse_connect_schema
from cdclake.debezium.formats import BadRecord
from cdclake.debezium.json_flat import tombstone_deletes
from cdclake.debezium.json_sql import ROW_SIDES, changes_sql, leaf
from cdclake.debezium.json_values import decoder

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from cdclake.debezium.connect import ConnectField
    from cdclake.debezium.schema import TopicSchema

_Fields = tuple[Sequence["ConnectField"], Sequence["ConnectField"], "TopicSchema"]

_FLAT_META = frozenset(("__op", "__lsn", "__source_ts_ms"))


def decoded(
    rows: pa.Table,
    schema: TopicSchema,
    key_schemas: Mapping[int, str],
    value_schemas: Mapping[int, str],
) -> pa.Table | None:
    """Raw rows of one topic (JSON with schema, any mix of its key and value schemas) as
    `changes_sql` reads them, each run of one (key, value) schema pair by its query, read
    unchecked first (see `json_sql`), its columns as the lake holds them (`lake_values`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    codec = schema.format.codec
    deletes = schema.format.flat and tombstone_deletes(value_schemas.values())
    pairs = pa.table({"k": rows["key_schema_id"], "v": rows["value_schema_id"]})
    parts: list[pa.Table] = []
    found_pairs = pairs.group_by(["k", "v"]).aggregate([]).to_pylist()
    with _database().cursor() as con:
        for k, v in sorted(((p["k"], p["v"]) for p in found_pairs), key=repr):
            same = pc.and_kleene(_same(rows["key_schema_id"], k), _same(rows["value_schema_id"], v))
            part = rows.filter(same)
            kf = codec.key_fields(key_schemas[k]) if k is not None else ()
            vf = codec.value_fields(value_schemas[v], "value") if v is not None else ()
            flat: tuple[frozenset[str], bool] | None = None
            if schema.format.flat:
                meta = parse_connect_schema(value_schemas[v]).fields if v is not None else ()
                flat = (frozenset(f.name for f in meta if f.name in _FLAT_META), deletes)
            parts.append(_read(con, part, (kf, vf, schema), flat))
    if not parts:
        return None
    return pa.concat_tables(parts, promote_options="permissive")


def _read(
    con: duckdb.DuckDBPyConnection,
    rows: pa.Table,
    fields: _Fields,
    flat: tuple[frozenset[str], bool] | None,
) -> pa.Table:
    """`changes_sql`'s rows of raw rows of one schema pair (`fields`: its key and value
    fields and the topic's schema), unchecked, then checked when one has a reason."""
    con.register("raw", rows)
    try:
        found = con.sql(changes_sql(*fields, "raw", False, flat)).to_arrow_table()
        if found["reason"].null_count != found.num_rows:
            found = con.sql(changes_sql(*fields, "raw", True, flat)).to_arrow_table()
    finally:
        con.unregister("raw")
    return lake_values(found, *fields[1:])


@functools.cache
def _database() -> duckdb.DuckDBPyConnection:
    """The process's one in-memory DuckDB database, on one thread (a connection costs
    ~20 ms; each call takes a cursor of its own, so threads can share it)."""
    import duckdb

    return duckdb.connect(config={"threads": 1})


def lake_values(
    found: pa.Table, value_fields: Sequence[ConnectField], schema: TopicSchema
) -> pa.Table:
    """`changes_sql`'s rows `found` of one value schema with each side's values as the
    lake holds them: a decimal from its unscaled value, JSON text decoded by `_decode` (a
    value that does not fit: NULL, and its record's reason says why)."""
    import pyarrow as pa

    by_name = {f.name: f for f in value_fields}
    reasons = None  # the records' reasons as a list, once a decoder may add to them
    for c in schema.columns:
        f = by_name.get(c.name)
        texts = f is not None and leaf(f, "x").value is None
        if not texts and not c.type.startswith("decimal("):
            continue
        for name in (f"{side}__{c.name}" for side in ROW_SIDES):
            column = found[name].combine_chunks()
            if texts and f is not None:  # `texts` holds only with a field
                reasons = found["reason"].to_pylist() if reasons is None else reasons
                column = _decode(column.to_pylist(), f, reasons, arrow_type(c.type))
            else:  # the unscaled value
                column = column.cast(pa.decimal128(38, 0)).view(arrow_type(c.type))
            found = found.set_column(found.schema.get_field_index(name), name, column)
    if reasons is None:
        return found
    return found.set_column(
        found.schema.get_field_index("reason"), "reason", pa.array(reasons, pa.string())
    )


def _decode(
    texts: list[Any], f: ConnectField, reasons: list[str | None], arrow: pa.DataType
) -> pa.Array:
    """JSON texts of field `f` as lake values of type `arrow`: by the field's SQL (`leaf`)
    when it has one, an array's items or a map's values each by their own field's, the
    others by `decoder`. A value that does not fit is None, and the first reason of its
    record (`reasons`, set in place) unless it has one."""
    import pyarrow as pa

    if leaf(f, "x").value is not None:
        return _by_sql(texts, f, reasons, arrow)
    if (f.type == "array" and f.items is not None) or (f.type == "map" and f.values):
        return _members(texts, f, reasons, arrow)
    fn = decoder(f)
    out: list[Any] = []
    for i, text in enumerate(texts):
        try:
            out.append(None if text is None else fn(json.loads(text)))
        except BadRecord as exc:
            out.append(None)
            why = str(exc) if str(exc).startswith("field ") else f"field {f.name!r}: {exc}"
            reasons[i] = reasons[i] or why
    return pa.array(out, arrow)


def _by_sql(
    texts: list[Any], f: ConnectField, reasons: list[str | None], arrow: pa.DataType
) -> pa.Array:
    """JSON texts of a field DuckDB's SQL decodes (`leaf`), decoded by it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    got = leaf(f, "x")
    members = pa.table(
        {"i": pa.array(range(len(texts)), pa.int64()), "t": pa.array(texts, pa.string())}
    )
    with _database().cursor() as con:
        con.register("members", members)
        found = con.sql(
            f"SELECT {got.value} AS v, {got.error} AS e FROM (SELECT i, CAST(t AS JSON) AS x "
            "FROM members) ORDER BY i"
        ).to_arrow_table()
    errors = found["e"].to_pylist()
    for i, why in enumerate(errors):
        reasons[i] = reasons[i] or why
    values = found["v"].combine_chunks()
    if f.logical == DECIMAL:  # the unscaled value
        values = values.cast(pa.decimal128(38, 0)).view(arrow)
    else:
        values = values.cast(arrow)
    refused = pa.array([why is not None for why in errors], pa.bool_())
    return pc.if_else(refused, pa.nulls(len(values), arrow), values)


def _members(
    texts: list[Any], f: ConnectField, reasons: list[str | None], arrow: pa.DataType
) -> pa.Array:
    """JSON texts of an array or a map field, each item (map value) decoded by its own
    field (`_decode`); a value with an item that does not fit is None."""
    import pyarrow as pa

    is_map = f.type == "map"
    kind, what = (dict, "a map") if is_map else (list, "an array")
    member = f.values if is_map else f.items
    assert member is not None
    offsets, valid, keys, items, owner = [0], [], [], [], []
    for i, text in enumerate(texts):
        value = None if text is None else json.loads(text)
        if value is not None and not isinstance(value, kind):
            reasons[i] = reasons[i] or f"field {f.name!r}: {value!r:.60} is not {what}"
            value = None
        pairs = value.items() if isinstance(value, dict) else enumerate(value or ())
        for k, item in pairs:
            keys.append(k)
            items.append(None if item is None else json.dumps(item))
            owner.append(i)
        offsets.append(len(items))
        valid.append(value is not None)
    member_type = arrow.item_type if is_map else arrow.value_type
    why: list[str | None] = [None] * len(items)
    values = _decode(items, member, why, member_type)
    for j, problem in enumerate(why):
        if problem is not None:
            reasons[owner[j]] = reasons[owner[j]] or problem
            valid[owner[j]] = False
    at, mask = pa.array(offsets, pa.int32()), pa.array([not v for v in valid], pa.bool_())
    if is_map:
        return pa.MapArray.from_arrays(at, pa.array(keys, arrow.key_type), values, arrow, mask=mask)
    return pa.ListArray.from_arrays(at, values, arrow, mask=mask)


def _same(column: pa.Array | pa.ChunkedArray, value: int | None) -> pa.Array:
    import pyarrow.compute as pc

    return pc.is_null(column) if value is None else pc.fill_null(pc.equal(column, value), False)
