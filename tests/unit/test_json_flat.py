"""Records flattened by ExtractNewRecordState (`kafka.format: json-flat`) resolve to the
rows their whole envelopes resolve to."""

from __future__ import annotations

import pytest
from cdclake.debezium.formats import WireFormat
from cdclake.exceptions import DecodeError
from cdclake.resolve.fold import resolve_rows
from cdclake.resolve.rules import TOAST_PLACEHOLDER

from tests.debezium_records import flat_record, key_record, value_record
from tests.unit.test_resolve import raw_table, topic_of


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


def test_a_flattened_record_without_its_operation_is_refused_naming_the_setting():
    setting = "add.fields=op,lsn,source.ts_ms"
    schema, keys, values = topic_of(raw_table({0: records(True)}), fmt=WireFormat.JSON_FLAT)
    no_op = flat_record("c", item(5, "e")).replace(b',"__op":"c"', b"")
    got = resolve_rows(raw_table({0: [(key_record(5), no_op)]}), schema, keys, values)
    assert [(offset, setting in why) for _, offset, why in got.bad] == [(0, True)]
    no_field = no_op.replace(b'{"type":"string","optional":true,"field":"__op"},', b"")
    with pytest.raises(DecodeError, match=setting):
        topic_of(raw_table({0: [(key_record(5), no_field)]}), fmt=WireFormat.JSON_FLAT)


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
