"""The one decode, check and resolve, on records shaped like the connector's: random
histories against a change-by-change statement of the rules (`reference`), histories
with known results, every type, records that cannot be applied, and the same code in
Spark tasks."""

import base64
import json
import random
import re
from decimal import Decimal

import pyarrow as pa
import pytest
from cdclake.debezium.connect import (
    INFINITY_DAYS,
    INFINITY_MICROS,
    INFINITY_MILLIS,
    arrow_type,
)
from cdclake.debezium.formats import WireFormat
from cdclake.debezium.schema import DELETED, OFFSET, OP, PARTITION, topic_schema
from cdclake.exceptions import DecodeError
from cdclake.kafka.reader import arrow_frame
from cdclake.kafka.scan import scan_rows
from cdclake.raw_rows import NEW_KEY_HEADER, OLD_KEY_HEADER, RawRows, kept_headers
from cdclake.resolve.fold import resolve_rows
from cdclake.resolve.rules import (
    FROM_KEY_PREFIX,
    FROM_LSN,
    HAS_VALUES,
    LINEAGE_OPS,
    TOAST_PLACEHOLDER,
    TOAST_PREFIX,
)

from tests.debezium_records import (
    ITEM_COLUMNS,
    decimal_b64,
    key_record,
    unscaled_b64,
    value_record,
)

TOPIC = "pg.public.items"
TOAST_B64 = base64.b64encode(TOAST_PLACEHOLDER.encode()).decode()


def raw_table(parts: dict[int, list]) -> pa.Table:
    """The reader's rows of records (key, value, and maybe headers) per partition,
    offsets from 0."""
    batches = []
    for partition, records in parts.items():
        rows = RawRows(TOPIC, partition)
        for offset, (key, value, *headers) in enumerate(records):
            rows.add(offset, 1000 + offset, key, value, *headers)
        batches.append(rows.batch())
    return pa.Table.from_batches(batches)


def topic_of(rows: pa.Table, key: tuple[str, ...] = (), fmt: WireFormat = WireFormat.JSON):
    """(TopicSchema, key schemas, value schemas) of the topic's raw rows, as the job
    makes them from the raw scan (`key`: the table's configured key)."""
    schemas = scan_rows(rows).schemas[TOPIC]
    keys, values = dict(schemas.get("key", [])), dict(schemas.get("value", []))
    schema = topic_schema(list(keys.values()), list(values.values()), key, TOPIC, fmt=fmt)
    return schema, keys, values


def resolved(spark, rows: pa.Table, key: tuple[str, ...] = ()):
    """(the resolved rows as sorted dicts, as the MERGE reads them; the result)."""
    local = resolve_rows(rows, *topic_of(rows, key))
    return ordered(arrow_frame(spark, local.rows, local.ddl)), local


def both(spark, rows: pa.Table, key: tuple[str, ...] = ()):
    """(the resolved rows as the reference of another fold, the same, the result)."""
    mine, local = resolved(spark, rows, key)
    return mine, [dict(r) for r in mine], local


def same(want, got, toast: bool):
    """Equal rows; a fold may leave out the TOAST flags when it met no placeholder: a
    flag that is False, or a key changed from that is NULL, counts as absent (`toast`:
    whether `got` carries them)."""

    def bare(rows):
        return [{k: v for k, v in r.items()
                 if not (k.startswith(TOAST_PREFIX) and v is False)
                 and not (k.startswith(FROM_KEY_PREFIX) and v is None)
                 and not (k == FROM_LSN and v is None)}
                for r in rows]  # fmt: skip

    assert bare(got) == bare(want)


def ordered(frame) -> list[dict]:
    """The rows as dicts in Kafka order, instants as text (Python cannot hold year 1 in
    local time)."""
    from pyspark.sql import functions as F

    frame = frame.select(*[F.col(f"`{f.name}`").cast("string").alias(f.name)
                           if f.dataType.typeName() == "timestamp" else F.col(f"`{f.name}`")
                           for f in frame.schema.fields])  # fmt: skip
    return sorted((r.asDict(recursive=True) for r in frame.collect()),
                  key=lambda r: (r[OFFSET], r[PARTITION]))  # fmt: skip


def reference(parts: dict[int, list]) -> dict[int, tuple]:
    """The rules stated change by change, for histories whose keys each stay in one
    partition: key -> (deleted, partition and offset of the change its row describes,
    its name (None for a deleted key), whether that name is left to the table)."""
    changes = []
    for p, records in parts.items():
        for o, (k, v) in enumerate(records):
            key = None if k is None else json.loads(k)["payload"]["id"]
            payload = None if v is None else json.loads(v)["payload"]
            changes.append((p, o, key, payload))
    truncates = [(o, p, c["source"]["lsn"]) for p, o, _, c in changes if c and c["op"] == "t"]
    if truncates:
        t_offset, t_partition, t_lsn = max(truncates)

        def after_truncate(p, o, c):
            if p == t_partition:
                return o > t_offset
            lsn = c and c["source"]["lsn"]
            return t_lsn is None or lsn is None or lsn > t_lsn

        changes = [x for x in changes if after_truncate(x[0], x[1], x[3])]
    out = {}
    for key in {x[2] for x in changes if x[2] is not None}:
        seen, prev_stale, kept = None, True, []
        for p, o, _, c in sorted(
            x for x in changes if x[2] == key and not (x[3] or {}).get("op") == "t"
        ):
            lsn = None if c is None else c["source"]["lsn"]
            stale = lsn is not None and seen is not None and lsn <= seen
            dropped = prev_stale if c is None else stale
            prev_stale = stale
            if lsn is not None and (seen is None or lsn > seen):
                seen = lsn
            if not dropped:
                kept.append((p, o, c))
        if not kept:
            continue
        p, o, c = kept[-1]
        deleted = c is None or c["op"] == "d"
        if c is None:  # a tombstone's row is described by its delete, when kept
            p, o = next(((q, n) for q, n, d in reversed(kept) if d is not None), (p, o))
        name, left = None, False
        if not deleted:
            name = c["after"]["name"]
            if name == TOAST_PLACEHOLDER:
                real = [d["after"]["name"] for _, _, d in kept if d and d["after"]]
                real = [n for n in real if n not in (None, TOAST_PLACEHOLDER)]
                name, left = (real[-1], False) if real else (None, True)
        out[key] = (deleted, p, o, name, left)
    return out


def as_reference(rows: list[dict]) -> dict[int, tuple]:
    flag = f"{TOAST_PREFIX}name"
    return {r["id"]: (r[DELETED], r[PARTITION], r[OFFSET], None if r[DELETED] else r["name"],
                      bool(r.get(flag)) and not r[DELETED])
            for r in rows}  # fmt: skip


def item(i, name, price="1.00", blob=b"\x01"):
    return {
        "id": i, "name": name, "price": None if price is None else decimal_b64(Decimal(price), 2),
        "day": 19000 + i, "at": 1_700_000_000_123_456 + i,
        "at_tz": f"2024-01-02T03:04:0{i % 10}.678901Z",
        "blob": base64.b64encode(blob).decode() if isinstance(blob, bytes) else blob,
    }  # fmt: skip


def history(seed: int, partitions: int = 1, toast: bool = True, resends: bool = True,
            truncates: bool = True, moves: bool = False) -> dict[int, list]:  # fmt: skip
    """A random stream of changes to a few keys: creates, updates (some with TOAST
    placeholders, unless `toast` is False), deletes with and without tombstones, lone
    tombstones, re-sent records (unless `resends` is False), snapshot reads without LSN,
    truncates (unless `truncates` is False) and, with `moves`, primary-key changes (a
    delete naming the new key, its tombstone, the new key's create naming the old key
    with a placeholder)."""
    rnd = random.Random(seed)
    parts: dict[int, list] = {p: [] for p in range(partitions)}
    sent: list[tuple[int, tuple]] = []
    lsn = 1000
    for _ in range(rnd.randint(20, 60)):
        lsn += rnd.randint(1, 3)
        k = rnd.randint(1, 6)
        p = k % partitions
        roll = rnd.random()
        name = rnd.choice(["a", "b", "ü", TOAST_PLACEHOLDER if toast else "c", None])
        blob = rnd.choice([b"\x00\xff", TOAST_B64 if toast else b"\x01", None])
        price = rnd.choice(["1.00", "-2.50", "99999999.99", None])
        if roll < 0.35:
            rec = (key_record(k), value_record("c", None, item(k, "new", price), lsn=lsn))
        elif roll < 0.65:
            rec = (key_record(k), value_record("u", None, item(k, name, price, blob), lsn=lsn))
        elif roll < 0.75:
            rec = (key_record(k), value_record("d", item(k, "old"), None, lsn=lsn))
            parts[p].append(rec)
            sent.append((p, rec))
            if rnd.random() < 0.7:
                rec = (key_record(k), None)
            elif not resends:
                continue  # else the delete is sent twice
        elif roll < 0.8:
            rec = (key_record(k), None)  # lone tombstone
        elif roll < 0.88 and sent and resends:
            p, rec = rnd.choice(sent)  # re-sent after a connector restart
        elif roll < 0.94:
            rec = (key_record(k), value_record("r", None, item(k, "snap"), lsn=None))
        elif moves and roll < 0.97:
            to = rnd.choice([n for n in range(1, 7) if n != k])
            parts[p] += [(key_record(k), value_record("d", item(k, "old"), None, lsn=lsn),
                          kept_headers([(NEW_KEY_HEADER, key_record(to))])),
                         (key_record(k), None)]  # fmt: skip
            parts[to % partitions].append(
                (key_record(to), value_record("c", None, item(to, TOAST_PLACEHOLDER), lsn=lsn),
                 kept_headers([(OLD_KEY_HEADER, key_record(k))])))  # fmt: skip
            continue
        elif rnd.random() < 0.3 and truncates:
            rec = (None, value_record("t", None, None, lsn=lsn))  # truncate
            p = rnd.randrange(partitions)
        else:
            rec = (key_record(k), value_record("u", None, item(k, "z"), lsn=lsn))
        parts[p].append(rec)
        sent.append((p, rec))
    return parts


@pytest.mark.parametrize("seed", range(12))
def test_random_histories_resolve_as_the_rules_say(spark, seed):
    parts = history(seed, partitions=1 + seed % 2)
    mine, local = resolved(spark, raw_table(parts))
    assert as_reference(mine) == reference(parts)
    assert sum(local.counts.values()) == len(mine)
    assert local.counts.get(True, 0) == sum(r[DELETED] for r in mine)


def test_a_deleted_keys_row_holds_no_placeholder(spark):
    """With soft deletes a deleted key's row is written with its last values: a
    placeholder in them takes the value from the batch, else NULL and flagged (the MERGE
    keeps the table's value); a key whose batch holds no row after of it says it has no
    values (the MERGE keeps the table's) and carries its delete's row before, which a
    key the lake does not hold takes (whole with REPLICA IDENTITY FULL)."""
    v = value_record
    records = [
        (key_record(1), v("c", None, item(1, "a", blob=b"\x07"), lsn=100)),
        (key_record(1), v("u", None, item(1, TOAST_PLACEHOLDER, blob=TOAST_B64), lsn=101)),
        (key_record(1), v("d", item(1, "old"), None, lsn=102)),
        (key_record(1), None),
        (key_record(2), v("u", None, item(2, TOAST_PLACEHOLDER, blob=b"\x08"), lsn=103)),
        (key_record(2), v("d", item(2, "old"), None, lsn=104)),
        (key_record(3), v("d", item(3, "old"), None, lsn=105)),
        (key_record(3), None),
        (key_record(4), v("u", None, item(4, "four"), lsn=106)),
    ]  # fmt: skip
    mine, local = resolved(spark, raw_table({0: records}))
    rows = {r["id"]: r for r in mine}
    assert rows[1][DELETED] and rows[2][DELETED] and rows[3][DELETED] and not rows[4][DELETED]
    assert (rows[1]["name"], rows[1]["blob"]) == ("a", b"\x07")
    assert (rows[2]["name"], rows[2]["blob"]) == (None, b"\x08")
    flags = {(r["id"], c) for r in mine for c in ("name", "blob") if r[f"{TOAST_PREFIX}{c}"]}
    assert flags == {(2, "name")}
    assert {r["id"]: r[HAS_VALUES] for r in mine} == {1: True, 2: True, 3: False, 4: True}
    assert (rows[3]["name"], rows[3]["blob"]) == ("old", b"\x01")
    assert rows[3]["price"] == Decimal("1.00")


def test_a_history_resolves_to_the_expected_rows(spark):
    v = value_record
    records = [
        (key_record(1), v("c", None, item(1, "a"), lsn=100)),  # 0
        (key_record(1), v("u", None, item(1, "b", "-2.50"), lsn=101)),  # 1
        (key_record(1), v("u", None, item(1, TOAST_PLACEHOLDER, "3.00"), lsn=102)),  # 2
        (key_record(2), v("d", item(2, "x"), None, lsn=103)),  # 3
        (key_record(2), None),  # 4 tombstone
        (key_record(3), v("u", None, item(3, TOAST_PLACEHOLDER), lsn=104)),  # 5
        (key_record(1), v("u", None, item(1, "b", "-2.50"), lsn=101)),  # 6 re-sent
        (key_record(4), None),  # 7 lone tombstone
    ]
    mine, local = resolved(spark, raw_table({0: records}))
    got = {r["id"]: r for r in mine}
    assert set(got) == {1, 2, 3}
    assert got[1]["name"] == "b" and got[1]["price"] == Decimal("3.00") and got[1][OFFSET] == 2
    assert got[2][DELETED] and got[2][OP] == "d"
    assert got[3][f"{TOAST_PREFIX}name"] is True and got[3]["name"] is None
    assert local.toast and local.counts == {False: 2, True: 1}
    assert local.max_source_ms == 1_700_000_000_000


def test_a_placeholder_takes_the_first_real_value_of_equal_offsets():
    """A key in two partitions (which the range path hands to the reference): changes
    at the same offset of each are taken in partition order, the first kept as `max`
    by offset keeps it, for the latest change and for a placeholder's real value alike
    (Spark's `max_by` takes either of such ties)."""
    v = value_record
    parts = {
        0: [(key_record(1), v("c", None, item(1, "a"), lsn=100))],
        1: [
            (key_record(1), v("u", None, item(1, "b"), lsn=200)),
            (key_record(1), v("u", None, item(1, TOAST_PLACEHOLDER), lsn=300)),
        ],
    }
    rows = raw_table(parts)
    local = resolve_rows(rows, *topic_of(rows))
    got = local.rows.to_pylist()
    assert [(r["id"], r["name"]) for r in got] == [(1, "a")]
    assert not local.toast  # no placeholder left for the table's value: no flags


def test_a_truncate_drops_what_came_before(spark):
    v = value_record
    records = [
        (key_record(1), v("c", None, item(1, "a"), lsn=100)),
        (None, v("t", None, None, lsn=101)),
        (key_record(2), v("c", None, item(2, "b"), lsn=102)),
    ]
    mine, local = resolved(spark, raw_table({0: records}))
    assert [r["id"] for r in mine] == [2]
    assert (local.truncate.offset, local.truncate.lsn) == (1, 101)


def test_a_table_without_key_keeps_every_change(spark):
    v = value_record
    records = [
        (None, v("c", None, item(1, "a"), lsn=100)),
        (None, v("u", item(1, "a"), item(1, TOAST_PLACEHOLDER), lsn=101)),
        (None, v("d", item(1, "a"), None, lsn=102)),
        (None, None),
        (None, v("t", None, None, lsn=103)),
    ]
    mine, _ = resolved(spark, raw_table({0: records}))
    assert [r[OP] for r in mine] == ["c", "u", "d", "t"]
    assert mine[1]["name"] == "a"  # the placeholder took the value before


def col(field, type_, name=None, **params):
    out = {"type": type_, "optional": True, "field": field}
    if name:
        out["name"] = name
    if params:
        out["parameters"] = params
    return out


TYPED = [
    {"type": "int32", "optional": False, "field": "id"},
    col("small", "int16"), col("big", "int64"), col("f32", "float"), col("f64", "double"),
    col("flag", "boolean"),
    col("d_neg", "bytes", "org.apache.kafka.connect.data.Decimal", scale="-2",
        **{"connect.decimal.precision": "5"}),
    col("d38", "bytes", "org.apache.kafka.connect.data.Decimal", scale="4",
        **{"connect.decimal.precision": "38"}),
    col("vs", "struct", "io.debezium.data.VariableScaleDecimal"),
    col("ts_ms", "int64", "io.debezium.time.Timestamp"),
    col("ts_ns", "int64", "io.debezium.time.NanoTimestamp"),
    col("t_ms", "int32", "io.debezium.time.Time"),
    col("t_us", "int64", "io.debezium.time.MicroTime"),
    col("t_ns", "int64", "io.debezium.time.NanoTime"),
    col("geo", "struct", "io.debezium.data.geometry.Geometry"),
    {**col("tags", "array"), "items": {"type": "string", "optional": True}},
    {**col("amounts", "array"), "items": {"type": "bytes", "optional": True,
     "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "1"}}},
    {**col("attrs", "map"), "keys": {"type": "string"}, "values": {"type": "int32"}},
    col("point", "struct", "io.debezium.data.geometry.Point"),
    *ITEM_COLUMNS[1:],
]  # fmt: skip
# the vs and geo struct members
TYPED[8]["fields"] = [col("scale", "int32"), col("value", "bytes")]
TYPED[14]["fields"] = [col("wkb", "bytes"), col("srid", "int32")]


def typed(i: int, **overrides) -> dict:
    row = {
        "id": i, "small": -7, "big": 2**62 + i, "f32": 0.1, "f64": 1e300, "flag": True,
        "d_neg": unscaled_b64(-123), "d38": unscaled_b64(-(10**37) - i),
        "vs": {"scale": 3, "value": unscaled_b64(10**45 + 1)},
        "ts_ms": 1_700_000_000_123, "ts_ns": 1_700_000_000_123_456_789, "t_ms": 45_296_789,
        "t_us": 86_400_000_000, "t_ns": 1_000_999, "geo": {"wkb": "AQE=", "srid": 4326},
        "tags": ["a", None, TOAST_PLACEHOLDER], "amounts": [unscaled_b64(-15), None],
        "attrs": {"x": 1, "y": None},
        "point": {"x": 1.5, "y": -2.0, "wkb": "AQE=", "srid": None},
        **item(i, f"n{i}"),
    }  # fmt: skip
    row.update(overrides)
    return row


def test_every_type_decodes_to_its_lake_value(spark):
    v = value_record
    records = [
        (key_record(1), v("c", None, typed(1), columns=TYPED)),
        (key_record(2), v("c", None, typed(2, day=INFINITY_DAYS[0], at=INFINITY_MICROS[1],
                                            ts_ms=INFINITY_MILLIS[0], at_tz="-infinity",
                                            vs={"scale": 0, "value": unscaled_b64(-5)},
                                            f32=3.4e38, geo={"wkb": None, "srid": None}),
                          columns=TYPED)),
        (key_record(3), v("c", None, {k: None for k in typed(3)} | {"id": 3}, columns=TYPED)),
        (key_record(4), v("c", None, typed(4, tags=[TOAST_PLACEHOLDER], at_tz="infinity",
                                            ts_ns=-1_500, t_ns=999),
                          columns=TYPED)),
    ] + [
        (key_record(10 + i), v("c", None, typed(10 + i, point=p), columns=TYPED))
        for i, p in enumerate([
            {"x": 1e7, "y": 1.0e-4, "z": -0.0, "big": 2**70},
            {"x": 123456789.123, "y": 0.001, "n": [1, 2.5e-300, True, None]},
            {"x": -9.999999e6, "y": 1e22, "s": 'a"b\n\u0001ü/', "o": {"k": {}}},
        ])
    ]  # fmt: skip
    mine, local = resolved(spark, raw_table({0: records}))
    got = {r["id"]: r for r in mine}
    assert got[1]["t_ms"] == "12:34:56.789000" and got[1]["t_us"] == "24:00:00.000000"
    assert got[1]["vs"] == "1" + "0" * 42 + ".001" and got[1]["d_neg"] == Decimal(-12300)
    assert got[1]["attrs"] == {"x": 1, "y": None} and got[1]["geo"]["srid"] == 4326
    assert str(got[2]["day"]) == "9999-12-31" and got[2]["vs"] == "-5"
    assert got[3]["small"] is None and got[3]["tags"] is None
    assert got[1]["point"] == '{"x":1.5,"y":-2.0,"wkb":"AQE=","srid":null}'
    assert got[10]["point"].startswith('{"x":1.0E7,"y":1.0E-4,"z":-0.0,')
    assert local.toast  # the one-element array of the placeholder


@pytest.mark.parametrize(
    "value, why",
    [
        (value_record("c", None, item(1, "a", blob="%%%")), "field 'blob': '%%%' is not base64"),
        (value_record("x", None, item(1, "a")), "unknown operation x"),
        (value_record("c", None, item(1, "a", price="100000000.00")), "field 'price': .*does not"),
        (value_record("c", None, {**item(1, "a"), "id": "one"}), "field 'id': 'one' is not"),
        (b'{"schema":{"type":"struct","fields":[{"type":"string","field":"op"},'
         b'{"type":"struct","field":"after","fields":[]}]},"payload":[1]}',
         "not a Debezium envelope"),
    ],
)  # fmt: skip
def test_a_record_that_cannot_be_applied_is_named_and_left_out(value, why):
    """Between good records, in a batch decoded fast until it meets the bad one."""
    good = [(key_record(2), value_record("c", None, item(2, "b"), lsn=5)),
            (key_record(3), value_record("c", None, item(3, "c"), lsn=6))]  # fmt: skip
    rows = raw_table({0: [good[0], (key_record(1), value), good[1]]})
    done = resolve_rows(rows, *topic_of(rows))
    [(partition, offset, reason)] = done.bad
    assert (partition, offset) == (0, 1) and re.search(why, reason), reason
    assert sorted(r["id"] for r in done.rows.to_pylist()) == [2, 3]


def test_a_bad_value_in_a_superseded_change_is_left_out_with_it():
    v = value_record
    rows = raw_table({0: [(key_record(1), v("c", None, item(1, "a", blob="%%%"), lsn=5)),
                          (key_record(1), v("u", None, item(1, "b"), lsn=6))]})  # fmt: skip
    done = resolve_rows(rows, *topic_of(rows))
    assert [b[:2] for b in done.bad] == [(0, 0)]
    assert [(r["id"], r["name"]) for r in done.rows.to_pylist()] == [(1, "b")]


def test_each_value_schema_decodes_its_own_records():
    """`time(3)` altered to `time(6)` within one batch (Debezium's Time in milliseconds,
    then MicroTime): each change is read by its own schema, whichever comes last; a value
    its field's decoder refuses, in a change a later one supersedes, names its record."""
    v = value_record
    ms = [*ITEM_COLUMNS, col("t", "int32", "io.debezium.time.Time")]
    us = [*ITEM_COLUMNS, col("t", "int64", "io.debezium.time.MicroTime")]
    rows = raw_table({0: [
        (key_record(1), v("c", None, {**item(1, "a"), "t": 45_296_789}, lsn=5, columns=ms)),
        (key_record(2), v("c", None, {**item(2, "b"), "t": "noon"}, lsn=6, columns=us)),
        (key_record(2), v("u", None, {**item(2, "b"), "t": 45_296_789_000}, lsn=7, columns=us)),
        (key_record(3), v("c", None, {**item(3, "c"), "t": 1_000}, lsn=8, columns=ms)),
    ]})  # fmt: skip
    done = resolve_rows(rows, *topic_of(rows))
    assert done.bad == ((0, 1, "field 't': 'noon' is not a int64"),)
    got = {r["id"]: r["t"] for r in done.rows.to_pylist()}
    assert got == {1: "12:34:56.789000", 2: "12:34:56.789000", 3: "00:00:01.000000"}


def test_a_record_whose_key_holds_no_value_cannot_be_applied():
    rows = raw_table({0: [(key_record(None), value_record("u", None, None, lsn=5))]})
    assert resolve_rows(rows, *topic_of(rows)).bad == ((0, 0, "record has no key"),)


def test_arrow_types_of_the_lake_types():
    assert arrow_type("decimal(10,2)") == pa.decimal128(10, 2)
    assert arrow_type("timestamp") == pa.timestamp("us", tz="UTC")
    assert arrow_type("map<string,array<timestamp_ntz>>") == pa.map_(
        pa.string(), pa.list_(pa.timestamp("us"))
    )
    assert arrow_type("struct<wkb:binary,srid:int>") == pa.struct(
        [("wkb", pa.binary()), ("srid", pa.int32())]
    )
    with pytest.raises(DecodeError, match="interval"):
        arrow_type("interval")


@pytest.mark.parametrize("wrapped", [True, False], ids=["envelope", "payload"])
def test_a_key_changed_from_another_takes_nothing_of_its_earlier_row(wrapped):
    """A primary-key change (`UPDATE … SET id = 3 WHERE id = 2`) sends the new key's create
    with its unchanged TOAST column as a placeholder, and the old key in the
    `__debezium.oldkey` header (as the JSON converter writes a key, or its payload alone):
    the placeholder is left flagged with the old key named (the write takes that key's
    value), never the value of a row key 3 had before; a create whose every value is real
    names no key."""
    v = value_record
    old = key_record(2) if wrapped else b'{"id": 2}'
    records = [
        (key_record(3), v("c", None, item(3, "stale"), lsn=9), None),
        (key_record(3), v("d", item(3, None), None, lsn=10), None),
        (key_record(3), None, None),
        (key_record(2), v("c", None, item(2, "long"), lsn=11), None),
        (key_record(2), v("d", item(2, None), None, lsn=12), None),
        (key_record(2), None, None),
        (key_record(3), v("c", None, item(3, TOAST_PLACEHOLDER), lsn=12), old),
        (key_record(4), v("c", None, item(4, "whole"), lsn=13), key_record(1)),
    ]
    raw = RawRows(TOPIC, 0)
    for offset, (key, value, old_key) in enumerate(records):
        raw.add(offset, 1000 + offset, key, value, kept_headers([(OLD_KEY_HEADER, old_key)]))
    rows = pa.Table.from_batches([raw.batch()])
    got = {r["id"]: r for r in resolve_rows(rows, *topic_of(rows)).rows.to_pylist()
           if r[OP] not in LINEAGE_OPS}  # fmt: skip
    three, two = got[3], got[2]
    assert (three["name"], three[f"{TOAST_PREFIX}name"], three[f"{FROM_KEY_PREFIX}id"]) == (
        None, True, 2)  # fmt: skip
    assert two[DELETED] and two["name"] == "long" and two[f"{FROM_KEY_PREFIX}id"] is None
    assert got[4]["name"] == "whole" and got[4][f"{FROM_KEY_PREFIX}id"] is None


def test_a_key_change_carries_the_old_key_as_of_the_change_through_chains():
    """Key 1 holds "a", then "b" (a TOAST update); its key changes to 2 (the name left as
    a placeholder), 2 changes to 3, and 1 is inserted again with "later": the change rows
    (`KEY_CHANGE`) hold each old key's value as of its change ("b" for 1; 2's has none of
    its own and points at the change it came from), each create names the change it took
    its row from (`KEY_CREATE`), and key 3's row points at 2's change, never at the "later"
    row of key 1. A key whose state starts before the records points at its own row."""
    v, p = value_record, TOAST_PLACEHOLDER
    moved = [
        (1, v("c", None, item(1, "a"), lsn=10), {}),
        (1, v("u", None, item(1, "b"), lsn=11), {}),
        (1, v("d", item(1, None), None, lsn=12), {NEW_KEY_HEADER: key_record(2)}),
        (1, None, {}),
        (2, v("c", None, item(2, p), lsn=12), {OLD_KEY_HEADER: key_record(1)}),
        (2, v("d", item(2, None), None, lsn=13), {NEW_KEY_HEADER: key_record(3)}),
        (2, None, {}),
        (3, v("c", None, item(3, p), lsn=13), {OLD_KEY_HEADER: key_record(2)}),
        (1, v("c", None, item(1, "later"), lsn=14), {}),
        (7, v("d", item(7, None), None, lsn=15), {NEW_KEY_HEADER: key_record(8)}),
    ]
    raw = RawRows(TOPIC, 0)
    for offset, (k, value, headers) in enumerate(moved):
        raw.add(offset, 1000 + offset, key_record(k), value,
                kept_headers(list(headers.items())))  # fmt: skip
    rows = pa.Table.from_batches([raw.batch()])
    got = resolve_rows(rows, *topic_of(rows)).rows.to_pylist()
    seen = {(r[OP], r["id"]): (r["name"], r[f"{TOAST_PREFIX}name"], r[f"{FROM_KEY_PREFIX}id"],
                                r[FROM_LSN]) for r in got}  # fmt: skip
    assert seen == {
        ("c", 1): ("later", False, None, None),
        ("d", 2): (None, True, 1, 12),  # a soft delete keeps its values as of the delete
        ("c", 3): (None, True, 2, 13),
        ("d", 7): (None, False, None, None),
        ("k", 1): ("b", False, None, None),
        ("k", 2): (None, True, 1, 12),
        ("n", 2): (None, False, 1, 12),
        ("n", 3): (None, False, 2, 13),
        ("k", 7): (None, True, None, None),
    }
    counted = resolve_rows(rows, *topic_of(rows)).counts
    assert counted == {False: 2, True: 2}, counted


def test_a_resent_truncate_is_not_the_batchs_last():
    """A truncate not above the last one the table applied, or an earlier one of the
    batch, is re-sent by a restarted connector: the one before it stays the last."""
    from cdclake.resolve.rules import Truncate, last_truncate

    t = Truncate(partition=0, offset=9, lsn=140)
    assert last_truncate([t]) is t  # no truncate loaded before (or unknown)
    assert last_truncate([t], 130) is t  # a newer one
    assert last_truncate([t], 140) is None  # itself, re-sent
    assert last_truncate([t], 150) is None  # older than one loaded
    assert last_truncate([Truncate(0, 9, None)], 150).lsn is None  # no LSN: applied
    assert last_truncate([], 150) is None
    again, newer = Truncate(0, 20, 140), Truncate(1, 30, 160)
    assert last_truncate([again, t]) is t  # the re-send comes after the original
    assert last_truncate([t, again, newer]) is newer
    assert last_truncate([Truncate(0, 5, 170), t]) == Truncate(0, 5, 170)  # older one later


def test_a_resent_truncate_keeps_the_snapshot_reads_before_it():
    """Rows read by an incremental snapshot (no LSN) after a truncate the table applied,
    then that truncate re-sent, in one batch: the reads stay. With the truncate itself in
    the batch before them, its re-send keeps them too."""
    v = value_record
    read = [(key_record(1), v("r", None, item(1, "a"), lsn=None)),
            (None, v("t", None, None, lsn=140)),
            (key_record(2), v("r", None, item(2, "b"), lsn=None))]  # fmt: skip
    rows = raw_table({0: read})
    schema = topic_of(rows)
    got = resolve_rows(rows, *schema, cut=140)
    assert got.truncate is None and sorted(got.rows["id"].to_pylist()) == [1, 2]
    got = resolve_rows(rows, *schema)  # a truncate the table did not apply: the read before
    assert got.truncate.lsn == 140 and got.rows["id"].to_pylist() == [2]  # it goes
    rows = raw_table({0: [(key_record(3), v("c", None, item(3, "c"), lsn=130)), *read]})
    got = resolve_rows(rows, *topic_of(rows))
    assert got.truncate.offset == 2 and sorted(got.rows["id"].to_pylist()) == [2]
    resent = raw_table({0: [(None, v("t", None, None, lsn=140)), *read]})
    got = resolve_rows(resent, *topic_of(resent))  # truncate, read 1, re-send, read 2
    assert got.truncate.offset == 0 and sorted(got.rows["id"].to_pylist()) == [1, 2]


@pytest.mark.parametrize("after_gap", [True, False])
def test_a_tombstone_after_a_gap_deletes_its_row(after_gap):
    """On a compacted topic the log cleaner removes a delete and keeps its tombstone: the
    reader marks the tombstone as following a gap, and it deletes the row; the first
    tombstone of its key without one follows a delete of an earlier batch: nothing."""
    v = value_record
    rows = raw_table({0: [(key_record(2), v("c", None, item(2, "b"), lsn=120)),
                          (key_record(1), None)]})  # fmt: skip
    gaps = pa.array([False, after_gap])
    rows = rows.set_column(rows.schema.get_field_index("follows_gap"), "follows_gap", gaps)
    got = resolve_rows(rows, *topic_of(rows)).rows.to_pylist()
    deleted = {r["id"]: r[DELETED] for r in got}
    assert deleted == ({2: False, 1: True} if after_gap else {2: False})
