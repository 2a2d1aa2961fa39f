"""Each key's resolved row from a table of decoded changes (`json_decode.decoded`'s), all
in Arrow and numpy: the truncate, the changes folded (`cdclake.resolve.latest`) and the
rows taken column by column."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdclake.debezium.connect import arrow_type
from cdclake.debezium.schema import (
    DELETED,
    LSN,
    OFFSET,
    OP,
    PARTITION,
    SOURCE_TS,
    Column,
    TopicSchema,
)
from cdclake.resolve.latest import NO_LSN, NONE, UNDECIDED, Latest, Records, latest
from cdclake.resolve.rows import absent
from cdclake.resolve.rules import (
    FROM_KEY_PREFIX,
    FROM_LSN,
    KEY_CHANGE,
    KEY_CREATE,
    MOVED,
    TOAST_PLACEHOLDER,
    TOAST_PREFIX,
    TOAST_TYPES,
    TRUNCATE,
    Truncate,
    last_truncate,
    toastable,
)


def _np(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    out: np.ndarray = column.to_numpy(zero_copy_only=False)
    return out


def _marked(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Which values are a TOAST placeholder (null: null), as their type holds it (an
    array: the placeholder alone)."""
    if pa.types.is_list(values.type):  # the one element joins to itself alone
        values = pc.binary_join(values, "\n")
    mark = TOAST_PLACEHOLDER.encode() if pa.types.is_binary(values.type) else TOAST_PLACEHOLDER
    return pc.equal(values, pa.scalar(mark, values.type))


def truncate_of(changes: pa.Table, cut: int | None = None) -> Truncate | None:
    """The changes' last truncate (`last_truncate`; `cut`: the LSN of the last truncate
    applied before them)."""
    truncates = pc.and_(pc.equal(changes["op"], TRUNCATE), pc.invert(changes["is_tombstone"]))
    found = changes.filter(pc.fill_null(truncates, False))
    columns = (found[name].to_pylist() for name in ("partition", "offset", "lsn"))
    return last_truncate((Truncate(*t) for t in zip(*columns, strict=True)), cut)


def applied(changes: pa.Table, keys: list[pa.Array], truncate: Truncate | None) -> np.ndarray:
    """The indices of the changes a resolve folds (see `fold._applied`)."""
    ops = changes["op"]
    keep = _np(pc.fill_null(pc.not_equal(ops, TRUNCATE), True))
    no_key = np.logical_and.reduce([_np(pc.is_null(k)) for k in keys])
    keep &= ~(_np(changes["is_tombstone"]) & no_key)
    if truncate is not None:  # what came before it in its partition (reads without an LSN
        # too), and every change whose LSN is not above its own: older, re-sent after it
        partitions, offsets = _np(changes["partition"]), _np(changes["offset"])
        keep &= (partitions != truncate.partition) | (offsets > truncate.offset)
        if truncate.lsn is not None:
            lsns, known = _np(pc.fill_null(changes["lsn"], 0)), _np(pc.is_valid(changes["lsn"]))
            keep &= ~known | (lsns > truncate.lsn)
    return np.flatnonzero(keep)


def change_keys(changes: pa.Table, schema: TopicSchema) -> list[pa.Array]:
    """Each change's key, a column of the key's each (its Kafka key's, else its row's)."""
    types = {c.name: arrow_type(c.type) for c in schema.key}
    return [
        pc.coalesce(
            *(changes[f"{side}__{k}"].cast(types[k]) for side in ("key", "after", "before"))
        )
        for k in schema.key_names
    ]


def step_truncate(changes: pa.Table, cut: int | None, earlier: Truncate | None) -> Truncate | None:
    """The truncate a step of a fold applies (`truncate_of`): one not above the table's
    (`cut`) nor the one an earlier step applied (`earlier`) is re-sent."""
    if earlier is not None and earlier.lsn is not None:
        cut = earlier.lsn if cut is None else max(cut, earlier.lsn)
    return truncate_of(changes, cut)


def key_hashes(table: pa.Table, key_names: Sequence[str]) -> np.ndarray:
    """A 64-bit number for each row's key (numpy uint64): equal keys give equal numbers,
    as Spark groups them. One integer key column is its own number; other keys are
    hashed (two keys of one number make their topic's ranges be read again in one task,
    never a wrong row)."""
    import hashlib

    import numpy as np
    import pyarrow as pa

    columns = [table.column(n) for n in key_names]
    if len(columns) == 1 and pa.types.is_integer(columns[0].type) and columns[0].null_count == 0:
        same: np.ndarray = columns[0].cast(pa.int64()).to_numpy().view(np.uint64)
        return same
    blake = hashlib.blake2b
    values = zip(*(c.to_pylist() for c in columns), strict=True)
    return np.fromiter(
        (int.from_bytes(blake(repr(k).encode(), digest_size=8).digest(), "little") for k in values),
        dtype=np.uint64,
        count=table.num_rows,
    )


DECIDED = "decided"  # a held change's `Records.decided` (a fold in steps)


def _folded(
    changes: pa.Table,
    schema: TopicSchema,
    follow: bool,
    cut: int | None,
    earlier: Truncate | None = None,
) -> tuple[pa.Table, list[pa.Array], list[Column], bool, Truncate | None, Latest]:
    """(the changes a resolve folds, their keys, the TOAST columns followed, whether a
    placeholder is among them, the truncate, `latest`'s winners); `follow`: follow the
    TOAST columns' last real values even without a placeholder (a fold in steps); `cut`:
    the LSN of the last truncate the table applied; `earlier`: the truncate an earlier
    step of the fold applied, which drops what it drops of these changes unless they hold
    a later one (`truncate_of`: one not above either is re-sent)."""
    keys = change_keys(changes, schema)
    truncate = step_truncate(changes, cut, earlier)
    at = pa.array(applied(changes, keys, truncate or earlier))
    picked = changes
    if len(at) < changes.num_rows:  # a take copies every column
        picked, keys = changes.take(at), [k.take(at) for k in keys]
    toasty = toastable(schema)
    moved = _np(pc.fill_null(picked[MOVED], False)) if toasty else np.zeros(picked.num_rows, bool)
    follow = follow or bool(moved.any())
    real, found = [], False
    for c in toasty:
        values = picked[f"after__{c.name}"]
        mark = _marked(values)
        found = found or bool(pc.any(mark).as_py())
        real.append(_np(pc.and_(pc.is_valid(values), pc.invert(pc.fill_null(mark, False)))))
    codes = [
        _np(
            pc.dictionary_encode(pa.chunked_array([k]) if isinstance(k, pa.Array) else k)
            .combine_chunks()
            .indices
        )
        for k in keys
    ]
    key = (
        np.unique(np.stack(codes, axis=1), axis=0, return_inverse=True)[1].ravel()
        if len(codes) > 1
        else codes[0]
    )
    lsn, n = picked["lsn"], picked.num_rows
    decided = (
        _np(pc.fill_null(picked[DECIDED], UNDECIDED)).astype(np.int8)
        if DECIDED in picked.column_names
        else np.full(n, UNDECIDED, np.int8)
    )
    records = Records(
        key=key.astype(np.int64),
        partition=_np(picked["partition"]).astype(np.int64),
        offset=_np(picked["offset"]).astype(np.int64),
        tombstone=_np(picked["is_tombstone"]),
        follows_gap=_np(picked["follows_gap"]),
        create=_np(pc.fill_null(pc.equal(picked["op"], "c"), False)),
        lsn=_np(pc.fill_null(lsn, 0)).astype(np.int64),
        has_lsn=_np(pc.is_valid(lsn)),
        has_after=_np(pc.fill_null(picked["has_after"], False)),
        moved=moved,
        real=np.stack(real, axis=1) if ((found or follow) and real) else np.zeros((n, 0), bool),
        decided=decided,
    )
    return picked, keys, toasty, found, truncate, latest(records)


def fold_step(
    held: pa.Table | None,
    changes: pa.Table,
    schema: TopicSchema,
    cut: int | None = None,
    earlier: Truncate | None = None,
) -> tuple[pa.Table, Truncate | None, int]:
    """(what a fold in steps holds after `changes` (decoded changes of one partition, in
    offset order): the changes the next step needs of `held` and them, with what was
    decided of each (`DECIDED`); the truncate among `changes`, if any (`cut`: the LSN of
    the last truncate the table applied; `earlier`: an earlier step's truncate); how many
    keys they are of)."""
    if held is not None:
        new = changes.append_column(DECIDED, pa.nulls(changes.num_rows, pa.int8()))
        changes = pa.concat_tables([held, new], promote_options="permissive")
    picked, _, _, _, truncate, won = _folded(changes, schema, True, cut, earlier)
    kept = picked.take(pa.array(won.keep))
    if DECIDED in kept.column_names:
        kept = kept.drop_columns([DECIDED])
    kept = kept.append_column(DECIDED, pa.array(won.decided, pa.int8()))
    return kept, truncate, len(won.last)


def resolve_table(
    changes: pa.Table, schema: TopicSchema, cut: int | None = None
) -> tuple[dict[str, Any], Truncate | None, bool]:
    """(resolved rows as a table of `result_columns`, the truncate, toast flags set);
    `cut`: the LSN of the last truncate the table applied."""
    picked, keys, toasty, found, truncate, won = _folded(changes, schema, False, cut)
    rows = _rows(picked, keys, won, schema, toasty if found else [])
    flags = [f"{TOAST_PREFIX}{c.name}" for c in toasty if f"{TOAST_PREFIX}{c.name}" in rows]
    left = any(pc.any(rows[f]).as_py() for f in flags)
    if len(won.moves):  # the moved keys' states, for the keys they moved to (`lineage`)
        rows, left = _with(rows, _moved_rows(picked, keys, won, schema, toasty)), True
    if not left:  # every placeholder took a value: the rows carry no TOAST flags
        for name in [*flags, *(f"{FROM_KEY_PREFIX}{k}" for k in schema.key_names), FROM_LSN]:
            rows.pop(name, None)
    return rows, truncate, left


def _rows(
    picked: pa.Table,
    keys: list[pa.Array],
    won: Latest,
    schema: TopicSchema,
    toasty: list[Column],
) -> dict[str, Any]:
    has = won.last >= 0
    last, change, after = won.last[has], won.change[has], won.after[has]
    tomb = _np(picked["is_tombstone"])
    ops = _np(pc.fill_null(picked["op"], ""))
    deleted = tomb[last] | (ops[last] == "d")
    from_after = np.where(deleted, after, last)
    from_before = deleted & (after < 0) & (change >= 0) & (ops[np.maximum(change, 0)] == "d")
    out: dict[str, Any] = {}
    for c in schema.columns:
        a = picked[f"after__{c.name}"].take(pa.array(np.maximum(from_after, 0)))
        b = picked[f"before__{c.name}"].take(pa.array(np.maximum(change, 0)))
        value = pc.if_else(
            pa.array(from_before),
            b,
            pc.if_else(pa.array(from_after >= 0), a, pa.nulls(len(a), a.type)),
        )
        out[c.name] = value
    for i, k in enumerate(schema.key_names):
        out[k] = keys[i].take(pa.array(last))
    at = np.where(tomb[last] & (change >= 0), change, last)
    lsn, known = _np(pc.fill_null(picked["lsn"], 0)), _np(pc.is_valid(picked["lsn"]))
    kept_lsn = won.lsn[has]  # the highest LSN of the key's kept changes (NONE: none)
    row_known = known[last] | (kept_lsn != NO_LSN)
    row_lsn = np.where(known[last], lsn[last], kept_lsn)
    before = np.maximum(change, 0)
    stale_known = np.where(tomb[last], (change >= 0) & known[before], known[last])
    stale = np.where(tomb[last], lsn[before], lsn[last])
    ts = picked["ts_ms"].take(pa.array(at))
    out.update(
        {
            "_cdc_deleted": pa.array(deleted),
            "_cdc_op": pa.array(np.where(tomb[last], "d", ops[last])),
            "_cdc_source_ts": pc.multiply(ts, 1000).cast(pa.timestamp("us", "UTC")),
            "_cdc_lsn": pa.array(row_lsn, mask=~row_known),
            "_cdc_check_lsn": pa.array(stale, mask=~stale_known),
            "_cdc_has_values": pa.array(~deleted | (after >= 0)),
            "_cdc_kafka_partition": picked["partition"].take(pa.array(at)),
            "_cdc_kafka_offset": picked["offset"].take(pa.array(at)),
        }
    )
    left = np.zeros(len(last), bool)  # a TOAST column left to the table
    for j, c in enumerate(toasty):
        holder = won.toast[has, j]
        value = out[c.name]
        mark = pc.fill_null(_marked(value), False)
        held = picked[f"after__{c.name}"].take(pa.array(np.maximum(holder, 0)))
        filled = pc.if_else(pa.array(holder >= 0), held, pa.nulls(len(held), held.type))
        out[c.name] = pc.if_else(mark, filled, value)
        unresolved = pc.and_(mark, pa.array(holder < 0))
        out[f"{TOAST_PREFIX}{c.name}"] = unresolved
        left |= _np(unresolved)
    if toasty:  # the key its last create was changed from (a primary-key change)
        out.update(_moved_from(picked, schema, won.create[has], left))
    return out


def _with(rows: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """`rows` and then `more` (arrays by name), a name one lacks `absent` in it."""
    sizes = [len(next(iter(d.values()))) for d in (rows, more)]
    out: dict[str, Any] = {}
    for name in dict.fromkeys([*rows, *more]):
        like = (rows[name] if name in rows else more[name]).type
        arrays = [
            d[name] if name in d else absent(name, like, n)
            for d, n in zip((rows, more), sizes, strict=True)
        ]
        out[name] = pa.concat_arrays(
            [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays]
        )
    return out


def _moved_from(
    picked: pa.Table, schema: TopicSchema, create: np.ndarray, wanted: np.ndarray
) -> dict[str, Any]:
    """The key each `create` (NONE: none) was changed from, where `wanted`, and the
    change's LSN (`FROM_LSN`): where the row's values left to it are found."""
    at = pa.array(np.maximum(create, 0))
    mask = pa.array(wanted & (create >= 0))
    out: dict[str, Any] = {}
    for name in [*(f"from__{k.name}" for k in schema.key), "lsn"]:
        value = picked[name].take(at)
        out[name] = pc.if_else(mask, value, pa.nulls(len(value), value.type))
    return {
        FROM_LSN: out.pop("lsn"),
        **{f"{FROM_KEY_PREFIX}{n.removeprefix('from__')}": v for n, v in out.items()},
    }


def _moved_rows(
    picked: pa.Table,
    keys: list[pa.Array],
    won: Latest,
    schema: TopicSchema,
    toasty: list[Column],
) -> dict[str, Any]:
    """A row per record of a primary-key change: its delete's (`KEY_CHANGE`: the old
    key, its LSN, each TOAST column's value as of it, flagged where the key's state
    before the records holds it, and where that state came from, `_moved_from`) and its
    create's (`KEY_CREATE`: the change it took its row from)."""
    at = pa.array(won.moves)
    n = len(won.moves)
    create = _np(pc.fill_null(pc.equal(picked["op"].take(at), "c"), False))
    out = {k: keys[i].take(at) for i, k in enumerate(schema.key_names)}
    out[OP] = pa.array(np.where(create, KEY_CREATE, KEY_CHANGE))
    out[DELETED] = pa.array(np.zeros(n, bool))
    for name, field in ((LSN, "lsn"), (PARTITION, "partition"), (OFFSET, "offset")):
        out[name] = picked[field].take(at)
    unset = np.zeros(n, bool)
    for j, c in enumerate(toasty):
        holder = np.where(create, NONE, won.move_toast[:, j])
        held = picked[f"after__{c.name}"].take(pa.array(np.maximum(holder, 0)))
        out[c.name] = pc.if_else(pa.array(holder >= 0), held, pa.nulls(n, held.type))
        out[f"{TOAST_PREFIX}{c.name}"] = pa.array((holder < 0) & ~create)
        unset |= (holder < 0) & ~create
    out.update(_moved_from(picked, schema, won.move_create, create | unset))
    return out


def changelog_table(changes: pa.Table, schema: TopicSchema) -> dict[str, Any]:
    """The rows of a table without a key: every change but tombstones, in order (a
    delete's row is its row before, a truncate's none), a TOAST placeholder taking the
    change's own row before's value."""
    t = changes.filter(pc.invert(changes["is_tombstone"]))
    ops = pc.fill_null(t["op"], "")
    deleted, truncate = pc.equal(ops, "d"), pc.equal(ops, TRUNCATE)
    out: dict[str, Any] = {}
    for c in schema.columns:
        after, before = t[f"after__{c.name}"], t[f"before__{c.name}"]
        none = pa.nulls(len(after), after.type)
        value = pc.if_else(deleted, before, pc.if_else(truncate, none, after))
        if c.type in TOAST_TYPES:
            value = pc.if_else(pc.fill_null(_marked(value), False), before, value)
        out[c.name] = value
    out.update(
        {
            DELETED: deleted,
            OP: t["op"],
            SOURCE_TS: pc.multiply(t["ts_ms"], 1000).cast(pa.timestamp("us", "UTC")),
            LSN: t["lsn"],
            PARTITION: t["partition"],
            OFFSET: t["offset"],
        }
    )
    return out
