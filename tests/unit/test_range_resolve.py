"""Ranges read and resolved whole in one task each (big batches) against the resolve of
all the records at once: the same rows once the ranges' results are put together, or the
reason they must be read again in one task."""

import dataclasses
import random
import time
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from cdclake.debezium.schema import DELETED
from cdclake.kafka.reader import arrow_frame
from cdclake.placement import MEASURED, Tuning
from cdclake.raw_rows import RawRows
from cdclake.resolve.range_plan import BAD_COLUMN, AcceptedTopic, accept, head_schemas
from cdclake.resolve.ranges import (
    BATCH_ROWS,
    KEYS_COLUMN,
    META_COLUMN,
    RangeFold,
    RangeSummary,
    TopicPlan,
    key_hashes,
    range_task,
)
from cdclake.resolve.rules import HAS_VALUES, TOAST_PLACEHOLDER, TOAST_PREFIX

from tests.debezium_records import ITEM_COLUMNS, PAIR_COLUMNS, key_record, pair_key, value_record
from tests.unit.test_resolve import (
    TOAST_B64,
    TOPIC,
    both,
    history,
    item,
    ordered,
    raw_table,
    same,
)


def reader_of(parts: dict[int, list], batch: int):
    """A range reader of the records of `parts`, `batch` at a time."""

    def reader(r: dict):
        rows = RawRows(r["topic"], r["partition"])
        for offset, (key, value, *headers) in enumerate(parts[r["partition"]]):
            if not r["start"] <= offset < r["end"]:
                continue
            rows.add(offset, 1000 + offset, key, value, *headers)
            if len(rows) == batch:
                yield rows.batch()
        if len(rows):
            yield rows.batch()

    return reader


def items_records(n: int) -> list:
    return [(key_record(k), value_record("c", None, item(k, "a"), lsn=k)) for k in range(n)]


def items_plan() -> TopicPlan:
    """The plan of a topic of the items table."""
    return plan_of({0: items_records(1)})


def heads(parts: dict[int, list]) -> list[dict]:
    return [{"topic": TOPIC, "partition": p, "start": 0, "end": len(recs)}
            for p, recs in parts.items()]  # fmt: skip


def plan_of(parts: dict[int, list], reader=None, key: tuple[str, ...] = (),
            tuning: Tuning = MEASURED) -> TopicPlan:  # fmt: skip
    """The plan the job makes of these partitions: the schemas at their head (`key`: the
    table's configured key)."""
    found = head_schemas(reader or reader_of(parts, 7), heads(parts))
    assert found is not None, "no key and value schemas at the head"
    key_schema, value_schema = found
    return TopicPlan(TOPIC, (key_schema,) if key_schema else (),
                     (value_schema,) if value_schema else (), key=key, tuning=tuning)  # fmt: skip


def range_rows(parts: dict[int, list], batch: int = 7, reader=None, plan=None,
               tuning: Tuning = MEASURED):  # fmt: skip
    """Run `range_task` over each partition of `parts` (records read `batch` at a time):
    the task's output batches and the summaries."""
    reader = reader or reader_of(parts, batch)
    task = range_task(reader, {TOPIC: plan or plan_of(parts, reader, tuning=tuning)})
    out = list(task(iter([pa.RecordBatch.from_pylist(heads(parts))])))
    return out, ends(out)[0]


def driven(parts: dict[int, list], plan=None, batch: int = 7):
    """The ranges of `parts` as the job takes them (`ranged._resolve_topic`): read again
    with the schemas they met beyond the plan, then in one task when their results
    cannot be put together. (the last output, what was accepted, the reads)."""
    reader = reader_of(parts, batch)
    plan = plan or plan_of(parts, reader)
    together = False
    for reads in range(1, 4):
        task = range_task(reader, {TOPIC: plan}, together)
        out = list(task(iter([pa.RecordBatch.from_pylist(heads(parts))])))
        summaries, hashes = ends(out)
        if any(s.unplanned for s in summaries):
            plan = plan.with_met(summaries, lambda schemas: {})
            continue
        got = accept(summaries, plan, hashes)
        if not isinstance(got, str):
            return out, got, reads
        together = True
    raise AssertionError("the ranges were never taken")


def ends(out) -> tuple[list[RangeSummary], list]:
    """The summaries in a task's output, and each range's key hashes."""
    summaries, hashes = [], []
    for b in out:
        for meta, keys in zip(b.column(META_COLUMN).to_pylist(),
                              b.column(KEYS_COLUMN).to_pylist(), strict=True):  # fmt: skip
            if meta is not None:
                summaries.append(RangeSummary.from_json(meta))
                hashes.append(np.frombuffer(keys, dtype=np.uint64))
    return summaries, hashes


def accepted(out, parts, plan=None) -> AcceptedTopic | str:
    summaries, hashes = ends(out)
    return accept(summaries, plan or plan_of(parts), hashes)


def unpacked(out, got: AcceptedTopic) -> pa.Table:
    """The resolved rows in a task's output, in the accepted columns."""
    return rows_of(out).select([n for n, _ in got.columns])


def rows_of(out) -> pa.Table:
    """The resolved rows in a task's output (not its summaries, nor records set aside)."""
    table = pa.Table.from_batches(out)
    rows = pc.and_(pc.is_null(table[META_COLUMN]), pc.is_null(table[BAD_COLUMN]))
    return table.filter(rows).drop([META_COLUMN, KEYS_COLUMN, BAD_COLUMN])


@pytest.mark.parametrize(
    "toast, resends",
    [(True, True), (False, True), (False, False)],
    ids=["placeholders", "none", "no-resends"],
)
@pytest.mark.parametrize("seed", range(12))
def test_ranges_resolve_as_in_spark(spark, seed, toast, resends):
    """Without placeholders a range is folded from its changes' headers alone (as
    columns when no change is a re-send); with them, mostly again from its start once
    the first is met."""
    parts = history(seed, partitions=1 + seed % 2, toast=toast, resends=resends)
    out, summaries = range_rows(parts)
    assert len(summaries) == len(parts)
    assert toast or not any(s.toast for s in summaries)
    got = accepted(out, parts)
    want, _, local = both(spark, raw_table(parts))
    if isinstance(got, str):  # only where the other partitions hold changes before it
        assert local.truncate is not None and len(parts) > 1 and "truncate" in got, got
        out, got, reads = driven(parts)  # then read in one task
        assert reads == 2 and len(ends(out)[0]) == 1
    assert isinstance(got, AcceptedTopic), got
    assert got.truncate == local.truncate
    rows = unpacked(out, got)
    assert sum(got.counts.values()) == rows.num_rows == len(want)
    assert got.counts == local.counts and got.max_source_ms == local.max_source_ms
    same(want, ordered(arrow_frame(spark, rows, got.ddl)), got.toast)


@pytest.mark.parametrize("seed", range(24))
def test_a_range_folded_in_steps_resolves_as_in_one(seed):
    """A range folded a few changes at a time (each step holding what the next needs
    of the keys' earlier changes, and of a key change's as of it) gives the rows and
    summary of one step over it all."""
    parts = history(seed, partitions=1 + seed % 2, toast=seed % 3 > 0, resends=True,
                    moves=seed % 2 == 0)  # fmt: skip
    whole, whole_summaries = range_rows(parts, batch=5)
    steps, step_summaries = range_rows(parts, batch=5, tuning=Tuning(fold_records=1 + seed % 4))
    assert [dataclasses.asdict(s) for s in step_summaries] == \
        [dataclasses.asdict(s) for s in whole_summaries]  # fmt: skip
    assert pa.Table.from_batches(steps).equals(pa.Table.from_batches(whole))


def folded(parts: dict[int, list], partition: int, batch: int = 7):
    """One range of `parts` read and resolved by `range_task`: the topic's plan, the
    range's rows (sorted by key) and summary."""
    plan = plan_of(parts)
    r = next(h for h in heads(parts) if h["partition"] == partition)
    task = range_task(reader_of(parts, batch), {TOPIC: plan})
    out = list(task(iter([pa.RecordBatch.from_pylist([r])])))
    (summary,), (hashes,) = ends(out)
    rows = rows_of(out)
    names = plan.schema.key_names
    return plan, rows.sort_by([(n, "ascending") for n in names]), (summary, sorted(hashes))


def toast_history(seed: int) -> tuple[list, dict[int, dict], dict[int, dict]]:
    """Changes as PostgreSQL sends them for a table with TOASTed columns: an update that
    leaves a stored value (not NULL) alone carries a placeholder for it, whether or not
    the key's earlier changes are in the range (some keys were inserted before it).
    Returns the records, each key's values at the end (None: deleted), where a value
    set before the range is `UNKNOWN`, and the values after each key's last change in
    the range that has a row after (a key with none in the range is not in it)."""
    rnd = random.Random(seed)
    state: dict[int, dict | None] = {}
    held: dict[int, dict] = {}
    for k in range(1, 9):  # inserted before the range: values the fold cannot know
        state[k] = {"name": UNKNOWN, "blob": UNKNOWN} if rnd.random() < 0.6 else None
    records, lsn = [], 100
    names = ["a", "b", "ü", None]
    blobs = [b"\x00\xff", b"\x02", None]
    for _ in range(rnd.randint(30, 90)):
        lsn += rnd.randint(1, 3)
        k = rnd.randint(1, 8)
        now, roll = state[k], rnd.random()
        if now is None:
            if roll < 0.15:
                records.append((key_record(k), None))  # a lone tombstone
                continue
            now = state[k] = {"name": rnd.choice(names[:3]), "blob": rnd.choice(blobs[:2])}
            op = "c" if roll < 0.9 else "r"
            records.append((key_record(k), value_record(op, None, item(k, now["name"],
                                                        blob=now["blob"]), lsn=lsn)))  # fmt: skip
            held[k] = dict(now)
        elif roll < 0.2:
            records.append((key_record(k), value_record("d", item(k, "old"), None, lsn=lsn)))
            if rnd.random() < 0.8:
                records.append((key_record(k), None))
            state[k] = None
        else:
            sent = {}
            for col, choices in (("name", names), ("blob", blobs)):
                if now[col] is not None and rnd.random() < 0.6:  # left alone: stored TOASTed
                    sent[col] = TOAST_PLACEHOLDER if col == "name" else TOAST_B64
                else:
                    now[col] = sent[col] = rnd.choice(choices)
            records.append((key_record(k), value_record("u", None, item(k, sent["name"],
                                                        blob=sent["blob"]), lsn=lsn)))  # fmt: skip
            held[k] = dict(now)
    return records, state, held


UNKNOWN = object()


@pytest.mark.parametrize("seed", range(30))
def test_placeholders_take_the_values_they_stand_for(seed):
    """A range with TOAST placeholders is folded following the TOAST columns: a
    placeholder takes its column's value from the key's earlier change in the range,
    and is NULL and flagged (the MERGE keeps the table's value) when none is there."""
    records, state, held = toast_history(seed)
    parts = {0: records}
    _, rows, (summary, _) = folded(parts, 0, batch=2 + seed % 6)
    written = {r["id"]: r for r in rows.to_pylist()}
    mark = TOAST_PLACEHOLDER.encode()
    for row in written.values():  # deleted keys' rows too (written with soft deletes)
        assert row["name"] != TOAST_PLACEHOLDER and row["blob"] != mark, row
    for k, now in state.items():
        row = written.get(k)
        if now is None:
            assert row is None or row[DELETED]
            if row is None:
                continue
            # a deleted key's row: its last values in the range, else its delete's row
            # before (`toast_history` sends it whole), which only a key the lake does
            # not hold takes: it has no values (the MERGE then keeps the table's)
            assert row[HAS_VALUES] == (k in held), (k, row)
            if k not in held:
                assert not any(row[f"{TOAST_PREFIX}{c}"] for c in ("name", "blob")), row
                assert (row["name"], row["blob"]) == ("old", b"\x01"), row
                continue
            now = held[k]
        if row is None:  # no change of the key in the range
            continue
        assert row[HAS_VALUES], (k, row)
        for col in ("name", "blob"):
            flag = row[f"{TOAST_PREFIX}{col}"]
            if now[col] is UNKNOWN:
                assert flag and row[col] is None, (k, col, row)
            else:
                assert not flag and row[col] == now[col], (k, col, row, now)


def test_a_placeholder_after_a_null_takes_the_last_real_value():
    v = value_record
    records = [(key_record(1), v("c", None, item(1, "a"), lsn=10)),
               (key_record(1), v("u", None, item(1, None), lsn=11)),
               (key_record(1), v("u", None, item(1, TOAST_PLACEHOLDER), lsn=12))]  # fmt: skip
    _, rows, _ = folded({0: records}, 0)
    assert rows.column("name").to_pylist() == ["a"]


def test_a_re_sent_change_is_dropped():
    """A connector that restarts sends changes again; a re-sent change (its LSN not
    above its key's last) is dropped."""
    v = value_record
    first = (key_record(1), v("c", None, item(1, "a"), lsn=10))
    records = [first, (key_record(1), v("u", None, item(1, "b"), lsn=11)), first,
               (key_record(2), v("c", None, item(2, "c"), lsn=12))]  # fmt: skip
    out, (summary,) = range_rows({0: records})
    rows = {r["id"]: r["name"] for r in unpacked(out, accepted(out, {0: records})).to_pylist()}
    assert rows == {1: "b", 2: "c"}


def test_a_negative_lsn_folds_as_any_other():
    v = value_record
    records = [(key_record(2), v("c", None, item(2, "c"), lsn=9)),
               (key_record(3), v("c", None, item(3, "a"), lsn=-4))]  # fmt: skip
    _, rows, _ = folded({0: records}, 0)
    assert rows.column("_cdc_lsn").to_pylist() == [9, -4]


@pytest.mark.parametrize("batch", [2, 3, 50])
def test_a_truncate_starts_the_range_again(spark, batch):
    """The changes before a range's last truncate are dropped, as the resolve of all the
    records drops them, in whichever read batch it falls; the topic keeps the truncate for
    the MERGE."""
    v = value_record
    records = [
        (key_record(1), v("c", None, item(1, "a"), lsn=10)),
        (key_record(2), v("c", None, item(2, "b"), lsn=11)),
        (None, v("t", None, None, lsn=12)),
        (key_record(3), v("c", None, item(3, "c"), lsn=13)),
        (key_record(1), v("c", None, item(1, "again"), lsn=14)),
        (None, v("t", None, None, lsn=15)),
        (key_record(2), v("c", None, item(2, "late"), lsn=16)),
        (key_record(2), v("u", None, item(2, "later"), lsn=17)),
        (key_record(4), v("d", item(4, "old"), None, lsn=18)),
        (key_record(4), None),
    ]  # fmt: skip
    parts = {0: records}
    _, rows, (summary, _) = folded(parts, 0, batch=batch)
    assert summary.truncate == [0, 5, 15]
    assert rows.column("id").to_pylist() == [2, 4]
    out, _ = range_rows(parts, batch=batch)
    got = accepted(out, parts)
    assert isinstance(got, AcceptedTopic), got
    want, _, local = both(spark, raw_table(parts))
    assert got.truncate == local.truncate and got.truncate.offset == 5
    same(want, ordered(arrow_frame(spark, unpacked(out, got), got.ddl)), got.toast)


@pytest.mark.parametrize("seed", range(10))
def test_random_histories_with_truncates_resolve_as_in_spark(spark, seed):
    """One partition, one to three truncates anywhere in a random history, read batches
    of 1 to 9 records: the rows and the truncate of the resolve of all the records."""
    rnd = random.Random(seed)
    records = history(200 + seed, toast=seed % 2 == 0, resends=seed % 3 != 0,
                      truncates=False)[0]  # fmt: skip
    for _ in range(rnd.randint(1, 3)):
        at = rnd.randrange(len(records) + 1)
        records.insert(at, (None, value_record("t", None, None, lsn=rnd.randint(900, 1200))))
    parts = {0: records}
    out, (summary,) = range_rows(parts, batch=rnd.randint(1, 9))
    got = accepted(out, parts)
    assert isinstance(got, AcceptedTopic), got
    want, _, local = both(spark, raw_table(parts))
    assert got.truncate == local.truncate is not None
    rows = unpacked(out, got)
    assert got.counts == local.counts and rows.num_rows == len(want)
    same(want, ordered(arrow_frame(spark, rows, got.ddl)), got.toast)


@pytest.mark.parametrize("kafka_key", [False, True], ids=["no Kafka key", "Kafka key"])
@pytest.mark.parametrize("seed", range(8))
def test_a_configured_key_resolves_range_by_range_as_in_spark(spark, seed, kafka_key):
    """A table keyed by a configured `key` (here `id`; a table without a primary key
    sends no Kafka key) is folded change by change, the key read from the rows: the
    Spark jobs' rows and truncate. Over two partitions, a key in both has the ranges
    read in one task."""
    parts = history(300 + seed, partitions=1 + seed % 2, toast=seed % 3 == 0)
    if not kafka_key:  # what a table without a primary key sends: no key, no tombstone
        parts = {p: [(None, value) for _, value in recs if value is not None]
                 for p, recs in parts.items()}  # fmt: skip
    plan = plan_of(parts, key=("id",))
    out, summaries = range_rows(parts, batch=1 + seed % 5, plan=plan)
    got = accepted(out, parts, plan=plan)
    want, _, local = both(spark, raw_table(parts), key=("id",))
    if isinstance(got, str):
        assert len(parts) > 1, got
        out, got, _ = driven(parts, plan, batch=1 + seed % 5)
    assert got.key_names == ("id",) and got.truncate == local.truncate
    rows = unpacked(out, got)
    assert got.counts == local.counts and rows.num_rows == len(want)
    same(want, ordered(arrow_frame(spark, rows, got.ddl)), got.toast)


def test_a_truncate_with_other_partitions_is_taken_when_they_hold_nothing_before_it(spark):
    """The Spark jobs drop the other partitions' changes at or below a truncate's LSN: a
    topic whose other ranges hold such a change, or truncates in two partitions, is
    read again in one task, which drops them."""
    v = value_record

    def got(other_lsns, truncates=(0,)):
        parts = {0: [(key_record(2), v("c", None, item(2, "b"), lsn=50))],
                 1: [(key_record(1 + 2 * i), v("c", None, item(1 + 2 * i, "a"), lsn=lsn))
                     for i, lsn in enumerate(other_lsns)]}  # fmt: skip
        for p in truncates:
            parts[p].append((None, v("t", None, None, lsn=60 + p)))
        parts[0].append((key_record(4), v("c", None, item(4, "after"), lsn=70)))
        out, _ = range_rows(parts)
        return accepted(out, parts), parts

    taken, _ = got([None, 61, 80])  # a snapshot read without an LSN, changes after it
    assert isinstance(taken, AcceptedTopic) and taken.truncate.partition == 0, taken
    assert taken.counts == {False: 4}
    for lsns, truncates, why, counts in [
        ([61, 60], (0,), "a truncate in partition 0 after changes of partition 1", {False: 2}),
        ([80], (0, 1), "truncates in more than one partition", {False: 1}),
    ]:  # fmt: skip
        reason, parts = got(lsns, truncates)
        assert reason == why
        out, taken, reads = driven(parts)
        want, _, local = both(spark, raw_table(parts))
        assert reads == 2 and taken.truncate == local.truncate and taken.counts == counts
        same(want, ordered(arrow_frame(spark, unpacked(out, taken), taken.ddl)), taken.toast)


@pytest.mark.parametrize("names", [["region"], ["region", "n"]], ids=["text", "two columns"])
def test_keys_of_text_or_of_two_columns_fold_as_columns(names):
    v = value_record
    rnd = random.Random(5)
    records, lsn = [], 0
    for _ in range(300):
        lsn += 1
        row = {"region": rnd.choice(["eu", "us", "ü", "ap", "sa"]), "n": rnd.randint(1, 4),
               "note": f"x{lsn}"}  # fmt: skip
        k = pair_key(row, names)
        roll = rnd.random()
        if roll < 0.15:
            records += [(k, v("d", row, None, lsn=lsn, columns=PAIR_COLUMNS)), (k, None)]
        else:
            records.append((k, v("u" if roll < 0.8 else "c", None, row, lsn=lsn,
                                 columns=PAIR_COLUMNS)))  # fmt: skip
    gone = {"region": "eu", "n": 1, "note": "last"}  # one key surely ends deleted
    k = pair_key(gone, names)
    records += [(k, v("d", gone, None, lsn=lsn + 1, columns=PAIR_COLUMNS)), (k, None)]
    parts = {0: records}
    plan, rows, (summary, _) = folded(parts, 0, batch=40)
    assert plan.schema.key_names == tuple(names)
    assert rows.num_rows == len({tuple(r[n] for n in names) for r in rows.to_pylist()}) > 4
    assert 0 < pc.sum(rows[DELETED]).as_py() < rows.num_rows


def test_a_range_that_starts_with_a_lone_tombstone_keeps_every_row(spark):
    """The batch before ended between a delete and its tombstone: the range's first key
    has no change to keep, and the rows of the other keys must all still be returned."""
    v = value_record
    records = [(key_record(99), None)]
    records += [(key_record(i), v("c", None, item(i, f"n{i}"), lsn=100 + i)) for i in range(5)]
    out, summaries = range_rows({0: records})
    got = accepted(out, {0: records})
    assert isinstance(got, AcceptedTopic), got
    rows = unpacked(out, got)
    want, _, _ = both(spark, raw_table({0: records}))
    assert sorted(rows.column("id").to_pylist()) == list(range(5)) == [r["id"] for r in want]
    assert got.counts == {False: 5}
    same(want, ordered(arrow_frame(spark, rows, got.ddl)), got.toast)


def test_a_key_folds_across_batches_and_streams_of_many_rows(spark):
    """More keys than one returned batch holds, each with changes in several read
    batches."""
    records = []
    for round_ in range(3):
        op = "u" if round_ else "c"
        for k in range(1, BATCH_ROWS + 50):
            value = value_record(op, None, item(k, f"r{round_}"), lsn=k + round_ * 10**6)
            records.append((key_record(k), value))
    records.append((key_record(7), value_record("d", item(7, "r2"), None, lsn=10**7)))
    records.append((key_record(7), None))
    out, (summary,) = range_rows({0: records}, batch=999)
    got = accepted(out, {0: records})
    rows = unpacked(out, got).to_pylist()
    assert len(out) == 3  # two batches of rows, then the summary
    assert len(rows) == BATCH_ROWS + 49 and got.counts == {False: BATCH_ROWS + 48, True: 1}
    names = {r["id"]: (r["name"], r["_cdc_deleted"]) for r in rows}
    assert names[1] == ("r2", False) and names[7] == ("r2", True)


def test_a_placeholder_left_in_one_range_gives_every_range_the_flags():
    """A range whose placeholder takes its key's earlier value in the range carries no
    flags; one whose placeholder is left to the table does, and the topic's every row
    then has them."""
    with_placeholder = item(1, "__debezium_unavailable_value")
    parts = {
        0: [(key_record(2), value_record("c", None, item(2, "two"), lsn=10))],
        1: [(key_record(1), value_record("c", None, item(1, "one"), lsn=11)),
            (key_record(1), value_record("u", None, with_placeholder, lsn=12)),
            (key_record(3), value_record("u", None, item(3, TOAST_PLACEHOLDER), lsn=13))],
    }  # fmt: skip
    out, summaries = range_rows(parts)
    assert [s.toast for s in sorted(summaries, key=lambda s: s.partition)] == [False, True]
    got = accepted(out, parts)
    rows = {r["id"]: r for r in unpacked(out, got).to_pylist()}
    assert rows[1]["name"] == "one" and rows[1][f"{TOAST_PREFIX}name"] is False
    assert rows[3]["name"] is None and rows[3][f"{TOAST_PREFIX}name"] is True
    assert rows[2][f"{TOAST_PREFIX}name"] is False  # filled in for the range without
    out, summaries = range_rows({1: parts[1][:2]})
    assert [s.toast for s in summaries] == [False]  # the placeholder took a value


def test_a_placeholder_met_late_takes_the_value_of_a_change_read_before_it(spark):
    """A placeholder met late in a range takes the value of a change read batches before
    it, the range read once."""
    v = value_record
    records = [(key_record(k), v("c", None, item(k, f"first{k}"), lsn=10 + k)) for k in range(8)]
    records += [(key_record(3), v("u", None, item(3, TOAST_PLACEHOLDER), lsn=50))]
    reads = []

    def counted(r: dict):
        reads.append(r["partition"])
        return reader_of({0: records}, 4)(r)

    out, (summary,) = range_rows({0: records}, batch=4, reader=counted)
    assert reads == [0, 0]  # the head, the range
    assert summary.records == len(records)
    got = accepted(out, {0: records})
    rows = {r["id"]: r for r in unpacked(out, got).to_pylist()}
    assert rows[3]["name"] == "first3" and not got.toast  # nothing left to the table
    want, _, _ = both(spark, raw_table({0: records}))
    same(want, ordered(arrow_frame(spark, unpacked(out, got), got.ddl)), got.toast)


def test_a_value_that_does_not_fit_is_named_even_when_replaced():
    """Every change is checked, the ones a later change of the key replaces too."""
    v = value_record
    bad = v("u", None, {**item(1, "a"), "day": "many"}, lsn=2)
    replaced = [(key_record(1), bad), (key_record(1), v("u", None, item(1, "b"), lsn=3))]
    for records in (replaced, replaced[:1]):
        out, (summary,) = range_rows({0: records})
        assert [(p, o) for p, o, _ in summary.bad] == [(0, 0)]
        assert "day" in summary.bad[0][2], summary.bad


@pytest.mark.parametrize(
    "records, why",
    [
        ([(key_record(1), b"not an envelope")], "not a JSON-with-schema envelope"),
        ([(None, value_record("c", None, {**item(1, "a"), "id": None}, lsn=1))], "no key"),
        ([(key_record(1), value_record("c", None, {**item(1, "a"), "id": "one"}, lsn=1))],
         "'id'"),
    ],
)  # fmt: skip
def test_a_record_the_fold_cannot_take_is_named_and_the_range_goes_on(records, why):
    """Met where it is read: the summary names it (partition, offset, reason) for the
    driver to fail the table or set it aside; the other records resolve."""
    good = (key_record(2), value_record("c", None, item(2, "b"), lsn=5))
    out, (summary,) = range_rows({0: [*records, good]}, plan=items_plan())
    assert len(summary.bad) == 1, summary
    ((partition, offset, reason),) = summary.bad
    assert (partition, offset) == (0, 0) and why in reason, reason
    got = accepted(out, {0: [*records, good]}, plan=items_plan())
    assert isinstance(got, AcceptedTopic) and got.bad == ((0, 0, reason),)
    assert got.counts == {False: 1}


EXTRA = [*ITEM_COLUMNS, {"type": "int32", "optional": True, "field": "extra"}]


def test_a_schema_beyond_the_plan_has_the_ranges_read_again_with_it(spark):
    """A range that meets a schema its plan does not know returns no row and reads on
    for every schema of its range; read again with them, the ranges resolve as the
    whole topic does (the new column in the rows)."""
    wider = value_record("c", None, {**item(2, "b"), "extra": 1}, lsn=2, columns=EXTRA)
    parts = {0: [(key_record(1), value_record("c", None, item(1, "a"), lsn=1))],
             1: [(key_record(2), wider), (key_record(3), wider)]}  # fmt: skip
    out, summaries = range_rows(parts)
    first, second = sorted(summaries, key=lambda s: s.partition)
    assert not first.unplanned and [sid for sid, _ in second.unplanned["value"]] != []
    assert second.records == 2 and second.counts == {} and len(out) == 3  # 0: rows, summary
    out, got, reads = driven(parts)
    assert reads == 2 and "extra" in dict(got.columns) and len(got.schemas["value"]) == 2
    want, _, _ = both(spark, raw_table(parts))
    same(want, ordered(arrow_frame(spark, unpacked(out, got), got.ddl)), got.toast)


def test_a_schema_set_aside_is_named_for_each_of_its_records():
    """A schema version that does not fit the table (`TopicPlan.set_aside`): each of its
    records goes to the summary with the reason, the others resolve."""
    wider = value_record("c", None, {**item(2, "b"), "extra": 1}, lsn=2, columns=EXTRA)
    parts = {0: [(key_record(1), value_record("c", None, item(1, "a"), lsn=1)),
                 (key_record(2), wider), (key_record(3), wider)]}  # fmt: skip
    ((wide, _),) = plan_of({0: [parts[0][1]]}).value_schemas
    plan = dataclasses.replace(plan_of(parts), set_aside=(("value", wide, "does not fit"),))
    out, (summary,) = range_rows(parts, plan=plan)
    assert summary.bad == [(0, 1, "does not fit"), (0, 2, "does not fit")]
    assert summary.counts == {False: 1} and not summary.unplanned
    table = pa.Table.from_batches(out)
    set_aside = table.filter(pc.is_valid(table[BAD_COLUMN]))[BAD_COLUMN].to_pylist()
    assert [(b["offset"], b["reason"], b["value"] is not None) for b in set_aside] == \
        [(1, "does not fit", True), (2, "does not fit", True)]  # fmt: skip
    assert rows_of(out).num_rows == 1


def test_a_range_of_tombstones_only_resolves_to_nothing():
    parts = {0: [(key_record(1), None), (key_record(2), None)]}
    plan = plan_of(parts)
    assert plan.key_schemas == items_plan().key_schemas and plan.value_schemas == ()
    out, (summary,) = range_rows(parts, plan=plan)
    assert summary.value_schemas == [] and summary.counts == {}
    assert isinstance(accepted(out, parts, plan), AcceptedTopic)
    # a value schema where the head had none: read again with it
    more = {0: [*parts[0], items_records(1)[0]]}
    out, (summary,) = range_rows(more, plan=plan)
    assert summary.unplanned["value"] == list(items_plan().value_schemas)
    out, got, reads = driven(more, plan)
    assert reads == 2 and got.counts == {False: 1}


def test_the_reader_is_closed_once_the_range_is_read():
    closed = []

    def reader(r: dict):
        rows = RawRows(r["topic"], r["partition"])
        try:
            for offset in range(100):  # a value schema other than the head's
                rows.add(
                    offset,
                    0,
                    key_record(1),
                    value_record(
                        "c", None, {**item(1, "a"), "extra": 1}, lsn=offset + 1, columns=EXTRA
                    ),
                )
                yield rows.batch()
        finally:
            closed.append(offset)

    task = range_task(reader, {TOPIC: items_plan()})
    plan = pa.RecordBatch.from_pylist([{"topic": TOPIC, "partition": 0, "start": 0, "end": 100}])
    out = list(task(iter([plan])))
    (summary,) = ends(out)[0]
    assert len(out) == 1 and summary.unplanned["value"] and summary.records == 100
    assert closed == [99]


def test_a_fold_reports_its_records():
    fold = RangeFold(items_plan(), 3)
    rows = RawRows(TOPIC, 3)
    rows.add(0, 0, key_record(1), value_record("c", None, item(1, "a"), lsn=1))
    fold.add(rows.batch())
    assert fold.summary.records == 1
    (summary,) = ends(list(fold.finish()))[0]
    assert (summary.partition, summary.counts, summary.unplanned) == (3, {False: 1}, {})


@pytest.mark.parametrize("seed", range(6))
def test_a_range_with_more_keys_than_it_holds_folds_them_by_bucket(seed):
    """An initial snapshot makes every record a new key: once a range's fold holds more
    than `range_keys` keys after a step, it goes on by key hash on disk, a bucket at a
    time, and resolves as a fold in memory does (the rows, by key)."""
    parts = history(400 + seed, toast=seed % 2 == 0, resends=True, moves=seed % 3 == 0)
    memory, (whole,) = range_rows(parts, batch=5, tuning=Tuning(fold_records=11))
    tuning = Tuning(fold_records=11, range_keys=2)
    spilled, (summary,) = range_rows(parts, batch=5, tuning=tuning)
    keys = list(items_plan().schema.key_names)

    def rows(out):
        return rows_of(out).sort_by([(k, "ascending") for k in keys] + [("_cdc_op", "ascending")])

    assert rows(spilled).to_pylist() == rows(memory).to_pylist()
    assert (summary.counts, summary.truncate, summary.toast) == \
        (whole.counts, whole.truncate, whole.toast)  # fmt: skip


def _frame(spark, out, plan: TopicPlan):
    from cdclake.spark import cache_level

    return arrow_frame(spark, pa.Table.from_batches(out), plan.ddl).persist(cache_level(0))


def test_the_job_takes_a_topic_only_when_its_rows_add_up(spark):
    """The job counts a topic's rows against what its ranges resolved: a batch of rows
    gone missing stops the batch before anything is written; a key found in two
    partitions has the ranges read again in one task."""
    from cdclake.exceptions import CdclakeError
    from cdclake.ranged import _ranged_topic, _summaries

    v, plan = value_record, items_plan()
    records = [(key_record(k), v("c", None, item(k, "n"), lsn=100 + k)) for k in range(5)]
    out, _ = range_rows({0: records, 1: records[:2]})
    summaries, hashes, _ = _summaries(_frame(spark, out, plan))
    assert accept(summaries, plan, hashes) == "a key is in more than one partition"

    out, _ = range_rows({0: records[:3], 1: records[3:]})
    frame = _frame(spark, out, plan)
    summaries, hashes, total = _summaries(frame)
    got = _ranged_topic(frame, plan, accept(summaries, plan, hashes), total)
    assert got.rows.count() == 5
    assert sorted(r["id"] for r in got.rows.collect()) == list(range(5))
    assert got.rows.columns == [n for n, _ in plan.columns(toast=False)]
    got.release()

    rows = [b for b in out if b.column(META_COLUMN).null_count == b.num_rows]
    assert len(rows) == 2
    frame = _frame(spark, [b for b in out if b is not rows[1]], plan)
    summaries, hashes, total = _summaries(frame)
    with pytest.raises(CdclakeError, match="resolved 5 rows but returned 3"):
        _ranged_topic(frame, plan, accept(summaries, plan, hashes), total)


def test_the_head_gives_the_schemas_of_its_first_records_that_carry_them():
    """Tombstones carry no value schema: the head read goes on to the next range."""
    v = value_record
    value = (key_record(1), v("c", None, item(1, "a"), lsn=1))
    parts = {0: [(key_record(9), None)] * 3, 1: [(key_record(9), None), value]}
    asked = []

    def reader(r: dict):
        asked.append((r["partition"], r["start"], r["end"]))
        return reader_of(parts, 2)(r)

    ranges = heads(parts)
    (key,), (value,) = items_plan().key_schemas, items_plan().value_schemas
    assert head_schemas(reader, ranges, records=50) == (key, value)
    assert asked == [(0, 0, 3), (1, 0, 2)]
    asked.clear()
    assert head_schemas(reader, ranges, records=1) == (key, None)
    assert asked == [(0, 0, 1), (1, 0, 1)]
    assert head_schemas(reader, [{**ranges[0], "end": 0}], records=1) is None


@pytest.mark.parametrize(
    "columns, rows",
    [
        ([("id", pa.int32())], [(1,), (2,), (-3,)]),
        ([("id", pa.int64())], [(1,), (None,), (2,)]),
        ([("code", pa.string())], [("a",), ("b",), ("",)]),
        ([("code", pa.string()), ("n", pa.int64())], [("a", 1), ("a", 2), ("b", 1)]),
        ([("d", pa.decimal128(10, 2))], [(Decimal("1.50"),), (Decimal("1.05"),)]),
    ],
)  # fmt: skip
def test_key_hashes_are_equal_for_equal_keys_only(columns, rows):
    def table(rs):
        return pa.table({n: pa.array([r[i] for r in rs], t) for i, (n, t) in enumerate(columns)})

    names = [n for n, _ in columns]
    first = key_hashes(table(rows), names)
    again = key_hashes(table(list(reversed(rows))), names)
    assert first.dtype == np.uint64 and len(set(first.tolist())) == len(rows)
    assert first.tolist() == list(reversed(again.tolist()))
    whole = accept([RangeSummary(TOPIC, 0), RangeSummary(TOPIC, 1)], items_plan(),
                   [first[:1], again[-1:]])  # fmt: skip
    assert whole == "a key is in more than one partition"
    assert isinstance(accept([RangeSummary(TOPIC, 0), RangeSummary(TOPIC, 1)], items_plan(),
                             [first[:1], first[1:]]), AcceptedTopic)  # fmt: skip


def test_the_python_workers_start_ahead_of_the_range_tasks(spark):
    """A job of one task per core, in a group of its own, imports the range tasks'
    modules; the thread's later jobs are not of the group."""
    from cdclake.ranged import WORKERS_JOB_GROUP, start_python_workers

    sc = spark.sparkContext
    tracker = sc.statusTracker()
    before = set(tracker.getJobIdsForGroup(WORKERS_JOB_GROUP))
    start_python_workers(spark)
    new = [j for j in tracker.getJobIdsForGroup(WORKERS_JOB_GROUP) if j not in before]
    assert len(new) == 1
    # the tracker hears of the job's end from Spark's listener bus, a moment later
    deadline = time.monotonic() + 30
    while (info := tracker.getJobInfo(new[0])).status != "SUCCEEDED":
        assert info.status == "RUNNING" and time.monotonic() < deadline, info.status
        time.sleep(0.1)
    tasks = sum(tracker.getStageInfo(s).numCompletedTasks for s in info.stageIds)
    assert tasks == sc.defaultParallelism
    assert sc.getLocalProperty("spark.jobGroup.id") is None


def _worker_pid(batches):
    import os

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"pid": [os.getpid()]}, pa.schema([("pid", pa.int64())]))


def test_the_range_tasks_run_in_the_workers_started_ahead(spark):
    """The range tasks' `mapInArrow` over `range_plan` takes the workers the start job
    left idle (Spark pools workers per environment: an RDD job's would be of no use)."""
    from cdclake.kafka.reader import range_plan
    from cdclake.offsets import OffsetRange
    from cdclake.ranged import start_python_workers

    started = set(start_python_workers(spark))
    assert 1 <= len(started) <= spark.sparkContext.defaultParallelism
    # more tasks than idle workers: the queue of idle workers reaches those started
    ranges = [OffsetRange("t", p, 0, 1) for p in range(8)]
    used = {r.pid for r in range_plan(spark, ranges).mapInArrow(_worker_pid, "pid long").collect()}
    assert started & used, (started, used)


def test_the_range_plan_is_a_range_a_partition_in_order(spark):
    from cdclake.kafka.reader import range_plan
    from cdclake.offsets import OffsetRange

    ranges = [OffsetRange(f"db.it's\\{i % 3}", i % 2, 10 * i, 10 * i + 5) for i in range(5)]
    plan = range_plan(spark, ranges)
    assert plan.schema.simpleString() == (
        "struct<topic:string,partition:int,start:bigint,end:bigint>"
    )
    assert plan.rdd.glom().map(len).collect() == [1] * 5
    assert [tuple(r) for r in plan.collect()] == [
        (r.topic, r.partition, r.start, r.end) for r in ranges
    ]
    empty = range_plan(spark, [])
    assert empty.schema == plan.schema and empty.count() == 0


def test_workers_that_cannot_start_ahead_are_logged_not_raised(caplog):
    class Context:
        defaultParallelism = 2

        def getLocalProperty(self, name):
            return None

        def setJobGroup(self, group, description):
            raise RuntimeError("the context was stopped\n  at org.apache.spark.Thing")

    class Session:
        sparkContext = Context()

    from cdclake.ranged import start_python_workers

    with caplog.at_level("INFO", logger="cdclake.ranged"):
        start_python_workers(Session())
    assert "not started ahead of the range tasks: the context was stopped" in caplog.text


@pytest.mark.parametrize("seed", range(6))
def test_a_table_without_key_is_returned_range_by_range_as_its_changelog(spark, seed):
    """Every change a row, as the resolve of all the records' changelog gives them: inserts, updates
    (with placeholders), deletes, truncates and snapshot reads, over two partitions,
    several read batches each."""
    v = value_record
    rnd = random.Random(seed)
    parts: dict[int, list] = {0: [], 1: []}
    lsn = 100
    for i in range(rnd.randint(20, 50)):
        lsn += 1
        row = item(i % 7, rnd.choice(["a", "ü", None]))
        roll = rnd.random()
        if roll < 0.5:
            value = v("c", None, row, lsn=lsn)
        elif roll < 0.7:
            after = {**row, "name": TOAST_PLACEHOLDER} if rnd.random() < 0.4 else row
            value = v("u", item(i % 7, "old"), after, lsn=lsn)
        elif roll < 0.85:
            value = v("d", row, None, lsn=lsn)
        elif roll < 0.92:
            value = v("t", None, None, lsn=lsn)
        else:
            value = v("r", None, row, lsn=None)
        parts[rnd.randrange(2)].append((None, value))
    out, summaries = range_rows(parts, batch=3 + seed % 4)
    assert not any(s.unplanned for s in summaries), summaries
    got = accepted(out, parts)
    assert isinstance(got, AcceptedTopic), got
    assert got.key_names == () and not got.toast
    rows = unpacked(out, got)
    want, mine, local = both(spark, raw_table(parts))
    assert rows.num_rows == len(want) == sum(got.counts.values())
    assert got.counts == local.counts and got.max_source_ms == local.max_source_ms
    same(want, ordered(arrow_frame(spark, rows, got.ddl)), False)
    assert TOAST_PLACEHOLDER not in str(rows.to_pylist())


def test_a_range_without_key_returns_its_rows_as_it_reads():
    """A range of a table without a key holds one read batch of rows at a time."""
    v = value_record
    records = [(None, v("c", None, item(i, f"n{i}"), lsn=100 + i)) for i in range(12)]
    reads = []

    def counted(r: dict):
        for raw in reader_of({0: records}, 4)(r):
            reads.append(raw.num_rows)
            yield raw

    plan = plan_of({0: records})
    r = next(h for h in heads({0: records}))
    reads.clear()
    task = range_task(counted, {plan.topic: plan})
    returned = []
    for batch in task([pa.RecordBatch.from_pylist([r])]):
        returned.append((len(reads), batch.num_rows))
    assert [n for _, n in returned] == [4, 4, 4, 1]  # three batches of rows, the summary
    assert [seen for seen, _ in returned[:3]] == [1, 2, 3]
