"""Records flattened by ExtractNewRecordState (`kafka.format: json-flat`) resolve to the
rows their whole envelopes resolve to."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from cdclake.debezium.formats import WireFormat
from cdclake.debezium.json_flat import lost
from cdclake.exceptions import DecodeError
from cdclake.raw_rows import RawRows, kept_headers
from cdclake.resolve.fold import resolve_rows
from cdclake.resolve.rules import TOAST_PLACEHOLDER

from tests.debezium_records import flat_record, key_record, value_record
from tests.unit.test_resolve import TOPIC, raw_table, topic_of


def item(i: int, name: str | None) -> dict:
    return {"id": i, "name": name, "price": None, "day": None, "at": None, "at_tz": None,
            "blob": None}  # fmt: skip


# (op, row before, row after, lsn) of each change, then a tombstone of its key with "t"
HISTORY = [
    ("c", None, item(1, "a"), 10),
    ("u", None, item(1, "b"), 20),
    ("c", None, item(1, "a"), 10),  # re-sent: older than the row's LSN
    ("c", None, item(2, "x"), 30),
    ("d", {**item(2, None)}, None, 40),
    ("tombstone", None, None, 2),
    ("r", None, item(3, "snap"), None),
    ("u", None, item(3, TOAST_PLACEHOLDER), 50),  # an unchanged TOASTed value
    ("c", None, item(4, "new"), 60),
]


def records(flat: bool, rewrite: bool = True) -> list:
    """The history's records; flattened with `rewrite=False`, a delete is its tombstone."""
    out = []
    for op, before, after, lsn in HISTORY:
        if op == "tombstone":
            out.append((key_record(lsn), None))
        elif flat and op == "d" and not rewrite:
            continue
        elif flat:
            out.append((key_record((after or before)["id"]),
                        flat_record(op, after or before, lsn, rewrite=rewrite)))  # fmt: skip
        else:
            out.append((key_record((after or before)["id"]), value_record(op, before, after, lsn)))
    return out


def resolved(flat: bool, rewrite: bool = True) -> list[dict]:
    rows = raw_table({0: records(flat, rewrite)})
    schema, keys, values = topic_of(rows, fmt=WireFormat.JSON_FLAT if flat else WireFormat.JSON)
    return sorted(resolve_rows(rows, schema, keys, values).rows.to_pylist(),
                  key=lambda r: r["id"])  # fmt: skip


def test_flattened_records_resolve_as_their_envelopes_do():
    whole, flat = resolved(False), resolved(True)
    assert flat == whole
    assert {r["id"]: (r["name"], r["_cdc_deleted"]) for r in flat} == {
        1: ("b", False),
        2: ("x", True),  # a deleted row's last values (what soft deletes keep)
        3: ("snap", False),
        4: ("new", False),
    }


def test_without_deleted_fields_a_flattened_tombstone_is_the_delete():
    whole, flat = resolved(False), resolved(True, rewrite=False)
    data = [{k: v for k, v in r.items() if not k.startswith("_cdc_") or k == "_cdc_deleted"}
            for r in whole]  # fmt: skip
    assert [{k: r[k] for k in data[0]} for r in flat] == data
    # the tombstone has no LSN or source time: the deleted row keeps its create's LSN
    deleted = next(r for r in flat if r["_cdc_deleted"])
    assert (deleted["_cdc_lsn"], deleted["_cdc_source_ts"], deleted["_cdc_check_lsn"]) == (
        30, None, None)  # fmt: skip
    # a batch that starts with a tombstone: with __deleted in the schema, it follows a
    # delete of an earlier batch (a no-op); without, it is the delete
    for rewrite, want in ((True, [(5, False)]), (False, [(2, True), (5, False)])):
        batch = [(key_record(2), None), (key_record(5), flat_record("c", item(5, "e"), 70,
                                                                     rewrite=rewrite))]  # fmt: skip
        rows = raw_table({0: batch})
        got = resolve_rows(rows, *topic_of(rows, fmt=WireFormat.JSON_FLAT)).rows.to_pylist()
        assert sorted((r["id"], r["_cdc_deleted"]) for r in got) == want


def test_a_null_payload_with_its_schema_is_the_delete():
    """The transform's tombstone mode, as the JSON converter writes it: the delete is the
    value schema with a null payload (then the tombstone)."""
    create = flat_record("c", item(2, "x"), 30, rewrite=False)
    deleted = json.dumps(
        {"schema": json.loads(create)["schema"], "payload": None}, separators=(",", ":")
    ).encode()
    rows = raw_table({0: [(key_record(2), create), (key_record(2), deleted),
                          (key_record(2), None), (key_record(3), flat_record(
                              "c", item(3, "y"), 40, rewrite=False))]})  # fmt: skip
    got = resolve_rows(rows, *topic_of(rows, fmt=WireFormat.JSON_FLAT))
    assert not got.bad
    assert sorted((r["id"], r["_cdc_deleted"]) for r in got.rows.to_pylist()) == [
        (2, True), (3, False)]  # fmt: skip


def test_a_flattened_record_without_its_operation_is_refused_naming_the_setting():
    setting = "add.fields=op,lsn,source.ts_ms or add.headers"
    schema, keys, values = topic_of(raw_table({0: records(True)}), fmt=WireFormat.JSON_FLAT)
    no_op = flat_record("c", item(5, "e")).replace(b',"__op":"c"', b"")
    got = resolve_rows(raw_table({0: [(key_record(5), no_op)]}), schema, keys, values)
    assert [(offset, setting in why) for _, offset, why in got.bad] == [(0, True)]
    # no __op in the schema either, and no header: the record, not its table, is refused
    no_field = no_op.replace(b'{"type":"string","optional":true,"field":"__op"},', b"")
    rows = raw_table({0: [(key_record(5), no_field)]})
    got = resolve_rows(rows, *topic_of(rows, fmt=WireFormat.JSON_FLAT))
    assert [(offset, setting in why) for _, offset, why in got.bad] == [(0, True)]


def test_whole_envelopes_in_a_flattened_pipeline_name_the_format_to_set():
    with pytest.raises(DecodeError, match="whole change event envelope.*kafka.format to json"):
        topic_of(raw_table({0: records(False)}), fmt=WireFormat.JSON_FLAT)


def as_headers(value: bytes | None, converter: str = "simple") -> tuple[bytes | None, str | None]:
    """A flattened record with add.fields, as the transform writes it with add.headers
    instead: the metadata fields (but `__deleted`) moved to headers, written by Connect's
    SimpleHeaderConverter (text) or its JsonConverter (an envelope)."""
    if value is None:
        return None, None
    event = json.loads(value)
    moved = ("__op", "__lsn", "__source_ts_ms")
    event["schema"]["fields"] = [f for f in event["schema"]["fields"] if f["field"] not in moved]
    found = {name: event["payload"].pop(name) for name in moved}
    texts = {
        name: str(v) if converter == "simple" else json.dumps({"schema": {}, "payload": v})
        for name, v in found.items() if v is not None
    }  # fmt: skip
    heads = kept_headers([(name, text.encode()) for name, text in texts.items()])
    return json.dumps(event, separators=(",", ":")).encode(), heads


@pytest.mark.parametrize("converter", ["simple", "json"])
def test_metadata_in_headers_resolves_as_metadata_in_fields(converter):
    fields = raw_table({0: records(True)})
    raw = RawRows(TOPIC, 0)
    for offset, (key, value) in enumerate(records(True)):
        raw.add(offset, 1000 + offset, key, *as_headers(value, converter))
    headers = pa.Table.from_batches([raw.batch()])
    assert "__op" not in headers.column("value_schema")[0].as_py()
    want = resolve_rows(fields, *topic_of(fields, fmt=WireFormat.JSON_FLAT)).rows.to_pylist()
    got = resolve_rows(headers, *topic_of(headers, fmt=WireFormat.JSON_FLAT)).rows.to_pylist()
    assert sorted(got, key=lambda r: r["id"]) == sorted(want, key=lambda r: r["id"])
    # a header that is not a number where one is needed is the record's reason
    bad = json.dumps({"__op": "c", "__lsn": "zero"})
    raw.add(9, 0, key_record(7), as_headers(flat_record("c", item(7, "g"), 9))[0], bad)
    rows = pa.Table.from_batches([raw.batch()])
    got = resolve_rows(rows, *topic_of(headers, fmt=WireFormat.JSON_FLAT))
    assert [(offset, "__lsn is not an integer" in why) for _, offset, why in got.bad] == [
        (9, True)]  # fmt: skip


def test_what_a_flattened_stream_lacks_is_said():
    full = flat_record("c", item(1, "a"), 10)
    schema = json.dumps(json.loads(full)["schema"])
    assert lost(schema, None) == []
    bare, heads = as_headers(full)
    bare_schema = json.dumps(json.loads(bare)["schema"])
    assert lost(bare_schema, heads) == []
    lacks = lost(bare_schema, None)
    assert [m.split(" (")[0].split(":")[0] for m in lacks] == [
        "records has no __op field or header", "records have no __lsn",
        "records have no __source_ts_ms"]  # fmt: skip
    tombstones = json.dumps(json.loads(flat_record("c", item(1, "a"), 10, rewrite=False))["schema"])
    assert [m for m in lost(tombstones, None) if "__deleted" in m]


@pytest.mark.parametrize("seed", range(12))
def test_random_histories_flattened_resolve_as_their_envelopes(seed):
    """The randomized replay test's histories (re-sends, tombstones, TOAST, snapshot
    reads; no truncates: the transform drops them), flattened as the benchmark flattens
    them: the same rows as the whole envelopes, which that test checks against the rules."""
    from cdclake_bench.sources import flat_value

    from tests.unit.test_resolve import history

    parts = history(seed, partitions=1 + seed % 2, truncates=False)
    flat = {p: [(k, None if v is None else flat_value(v)) for k, v in pairs]
            for p, pairs in parts.items()}  # fmt: skip
    key = lambda r: (r["id"], r["_cdc_kafka_partition"])  # noqa: E731
    got, want = raw_table(flat), raw_table(parts)
    assert sorted(resolve_rows(got, *topic_of(got, fmt=WireFormat.JSON_FLAT)).rows.to_pylist(),
                  key=key) == sorted(resolve_rows(want, *topic_of(want)).rows.to_pylist(),
                                     key=key)  # fmt: skip
