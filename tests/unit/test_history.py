"""The history (SCD type 2) of random change histories, in random batch cuts, against the
versions the generator says the records hold (`tests.histories`)."""

import random
from datetime import date

import pytest
from cdclake.debezium.json_decode import decoded
from cdclake.raw_rows import RawRows
from cdclake.resolve.history import history, moved_from
from cdclake.resolve.rules import TOAST_PLACEHOLDER
from cdclake.resolved import Before, Version

from tests.debezium_records import key_record, value_record
from tests.histories import generate, item, placed, ts_of, versions
from tests.unit.test_resolve import TOPIC, topic_of

SEEDS = 24


def changes_of(part: list[tuple]) -> list[dict]:
    """The decoded changes of placed records (partition, offset, key, value, headers)."""
    batches = {}
    for p, off, k, v, h in part:
        rows = batches.setdefault(p, RawRows(TOPIC, p))
        rows.add(off, 1000 + off, k, v, *([h] if h else []))
    import pyarrow as pa

    raw = pa.Table.from_batches([r.batch() for r in batches.values()])
    schema, keys, values = topic_of(raw)
    return schema, decoded(raw, schema, keys, values).to_pylist()


class Store:
    """A history table as the write keeps it: every version by (partition, offset)."""

    def __init__(self) -> None:
        self.rows: dict[tuple, Version] = {}
        self.truncated: int | None = None

    def before(self, changes: list[dict]) -> Before:
        by_key: dict[tuple, list[Version]] = {}
        for v in self.rows.values():
            by_key.setdefault(v.key, []).append(v)
        latest = {k: max(vs, key=lambda v: v.lsn or 0) for k, vs in by_key.items()}
        high = {
            k: max(x for v in vs for x in (v.lsn, v.end_lsn, v.updated_lsn) if x is not None)
            for k, vs in by_key.items()
        }
        as_of = {}
        for c in changes:
            source = moved_from(c, ("id",))
            if source is not None:
                older = [v for v in by_key.get(source, []) if (v.lsn or 0) < c["lsn"]]
                if older:
                    as_of[(source, c["lsn"])] = max(older, key=lambda v: v.lsn or 0).values
        return Before(latest, as_of, self.truncated, high)

    def apply(self, changed) -> None:
        for version in changed.earlier:
            self.rows[(version.partition, version.offset)] = version
        if changed.truncates:
            (lsn, ms), self.truncated = changed.truncates[0], changed.truncates[-1][0]
            for v in self.rows.values():
                if v.end is None:
                    v.end, v.end_lsn = ms, lsn
        for v in changed.versions:
            self.rows[(v.partition, v.offset)] = v

    def seen(self) -> set[tuple]:
        return {
            (v.key[0], v.values["name"], v.lsn, None if v.end is None else v.end_lsn)
            for v in self.rows.values()
        }


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_histories_in_random_cuts_hold_the_source_versions(seed):
    rng = random.Random(seed)
    partitions = 1 + seed % 3
    log: list = []
    records, _, _ = generate(rng, steps=60, keys=4, truncates=partitions == 1, log=log)
    spread = placed(records, partitions)
    cuts = sorted(rng.sample(range(1, len(records)), 6)) + [len(records)]
    store, start = Store(), 0
    for end in cuts:
        schema, changes = changes_of(spread[start:end])
        store.apply(history(changes, schema, store.before(changes)))
        if partitions == 1:  # in one partition a cut is a point in the source's order
            assert store.seen() == versions(log, end), f"seed {seed}: cut {end} of {cuts}"
        start = end
    assert store.seen() == versions(log, len(records)), f"seed {seed}"
    for v in store.rows.values():  # a version's times are its changes' source times
        assert v.start == ts_of(v.lsn) and (v.end is None or v.end == ts_of(v.end_lsn))


def test_a_snapshot_read_of_the_open_row_adds_no_version_and_a_changed_one_does():
    def read(name):
        return value_record("r", None, item(1, name), lsn=None)

    part = [(0, 0, key_record(1), value_record("c", None, item(1, "a"), lsn=10), None),
            (0, 1, key_record(1), read("a"), None),
            (0, 2, key_record(1), read("b"), None)]  # fmt: skip
    schema, changes = changes_of(part)
    got = history(changes, schema, Before())
    assert [(v.values["name"], v.op, v.end) for v in got.versions] == [
        ("a", "c", 1_700_000_000_000),
        ("b", "r", None),
    ]


def test_a_placeholder_takes_the_open_versions_value_from_before_the_batch():
    schema, changes = changes_of(
        [(0, 5, key_record(1), value_record("u", None, item(1, TOAST_PLACEHOLDER), lsn=30), None)]
    )
    opened = Version((1,), {**item(1, "kept"), "id": 1}, 0, 20, 0, 1, "c")
    got = history(changes, schema, Before({(1,): opened}, high={(1,): 20}))
    assert [v.values["name"] for v in got.versions] == []  # the same row: no new version
    changed = {**item(1, TOAST_PLACEHOLDER), "day": 5}
    schema, changes = changes_of(
        [(0, 6, key_record(1), value_record("u", None, changed, lsn=40), None)]
    )
    got = history(changes, schema, Before({(1,): opened}, high={(1,): 20}))
    assert [(v.values["name"], v.lsn) for v in got.versions] == [("kept", 40)]
    assert [(v.lsn, v.end, v.end_lsn) for v in got.earlier] == [(20, 1_700_000_000_000, 40)]
    assert opened.end is None  # the history's own is left as it was


def test_untracked_columns_change_the_open_version_in_place_and_resent_ones_do_not():
    def update(offset, lsn, **row):
        return (0, offset, key_record(1), value_record("u", None, {**item(1, "a"), **row},
                                                       lsn=lsn), None)  # fmt: skip

    part = [(0, 0, key_record(1), value_record("c", None, item(1, "a"), lsn=10), None),
            update(1, 20, day=1),  # only `day`: in place
            update(2, 30, day=2, name="b")]  # fmt: skip
    schema, changes = changes_of(part)
    got = history(changes, schema, Before(), tracked=["name"])
    assert [(v.values["name"], v.values["day"], v.updated_lsn) for v in got.versions] == [
        ("a", date(1970, 1, 2), 20),
        ("b", date(1970, 1, 3), None),
    ]
    opened = got.versions[-1]
    later = [update(3, 40, name="b", day=5), update(4, 35, name="b", day=4)]  # 35: re-sent
    schema, changes = changes_of(later)
    again = history(changes, schema, Before({(1,): opened}, high={(1,): 30}), tracked=["name"])
    assert again.versions == []
    assert [(v.values["day"], v.updated_lsn) for v in again.earlier] == [(date(1970, 1, 6), 40)]
