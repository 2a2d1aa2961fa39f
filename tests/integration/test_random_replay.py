"""Randomised: interleavings of changes, incremental snapshot reads and connector replays,
loaded in random batch cuts through the real MERGE into Iceberg, against a reference model.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from functools import partial

import pytest
import yaml
from cdclake.iceberg.merge_sql import KeyRange
from cdclake.job import run_batch
from cdclake.kafka.reader import RawSource
from cdclake.offsets import BatchPlan, OffsetRange
from cdclake.placement import MEASURED, Placement, Tuning
from cdclake.raw_rows import (
    NEW_KEY_HEADER,
    OLD_KEY_HEADER,
    RawRows,
    kept_headers,
)
from cdclake.resolve.rules import TOAST_PLACEHOLDER
from cdclake_bench.avro_records import AvroWriter, registry_register

from tests.conftest import DEMO_PIPELINE
from tests.debezium_records import PAIR_COLUMNS, key_record, pair_key, value_record
from tests.histories import generate, history_rows, item, placed, versions
from tests.integration.helpers import make_pipeline, stray_files

pytestmark = pytest.mark.integration


def records_source(records, start: int = 0) -> RawSource:
    """A source whose Spark tasks yield the reader's raw rows of `records` (key, value),
    at offsets from `start`, as a Kafka range's reader does with the pipeline's format."""

    def reader(kafka, r: dict):
        rows = kafka.format.raw_rows(r["topic"], r["partition"], kafka.schema_registry)
        found = [(off, k, v) for off, (k, v) in enumerate(records, start)
                 if r["start"] <= off < r["end"]]  # fmt: skip
        rows.add_many([o for o, _, _ in found], [0] * len(found), [k for _, k, _ in found],
                      [v for _, _, v in found])  # fmt: skip
        yield rows.batch()

    return RawSource(lambda kafka: partial(reader, kafka))


def as_avro(records, registry, topic: str) -> list:
    """`records` (key, value) as the Avro converter writes them, their schemas registered
    in the stack's registry."""
    write = AvroWriter(registry_register(registry.url))
    return [(write(k, f"{topic}-key"), write(v, f"{topic}-value")) for k, v in records]


def load_one(spark, pipeline, name: str, raw, start: int, end: int, placement: str = "auto",
             tuning: Tuning = MEASURED):  # fmt: skip
    """Run one batch of `raw` (a `RawSource` of offsets start..end of the pipeline's one
    table's topic)."""
    topic = pipeline.topic_for(pipeline.tables[0])
    plan = BatchPlan(pipeline.name, name, (OffsetRange(topic, 0, start, end),))
    return run_batch(spark, pipeline, plan, read=raw, placement=Placement(placement),
                     tuning=tuning)  # fmt: skip


# every MERGE filtered by key as one into a big table is
FILTER_EVERY_MERGE = dataclasses.replace(MEASURED, key_filter_rows=0)


def merge_key_filters(monkeypatch) -> list:
    """The list the `key_values` of each MERGE built go into, in order."""
    import cdclake.iceberg.write

    build, filtered = cdclake.iceberg.write.build_merge_sql, []

    def spy(*args, **kwargs):
        filtered.append(kwargs.get("key_values"))
        return build(*args, **kwargs)

    monkeypatch.setattr(cdclake.iceberg.write, "build_merge_sql", spy)
    return filtered


def lake_names(spark, pipeline) -> dict[int, str]:
    """id -> name of the rows in the pipeline's one table."""
    target = pipeline.qualified_target(pipeline.tables[0])
    return {r["id"]: r["name"] for r in spark.table(target).collect()}


def load_slice(spark, pipeline, name: str, part, raw_by: str, tuning: Tuning = MEASURED):
    """Run one batch of the placed records `part` (a slice of `placed`), read by a Kafka
    source's readers and resolved where `raw_by` says."""
    topic = pipeline.topic_for(pipeline.tables[0])
    spans: dict[int, list[int]] = {}
    for p, off, *_ in part:
        spans.setdefault(p, [off, off])[1] = off
    ranges = tuple(OffsetRange(topic, p, lo, hi + 1) for p, (lo, hi) in sorted(spans.items()))
    plan = BatchPlan(pipeline.name, name, ranges)

    def reader(kafka, r: dict):
        rows = kafka.format.raw_rows(r["topic"], r["partition"], kafka.schema_registry)
        found = [(off, k, v, h) for p, off, k, v, h in part
                 if p == r["partition"] and r["start"] <= off < r["end"]]  # fmt: skip
        offsets, keys, values, heads = zip(*found, strict=True) if found else ([],) * 4
        rows.add_many(list(offsets), [0] * len(found), list(keys), list(values), list(heads))
        yield rows.batch()

    read = RawSource(lambda kafka: partial(reader, kafka))
    return run_batch(spark, pipeline, plan, read=read, placement=Placement(raw_by),
                     tuning=tuning)  # fmt: skip


# One history per setting; a setting that had several seeds runs one longer history with
# more cuts (`LONG`: its steps and cuts), which costs fewer batches than separate ones.
LONG = {0: (100, 12), 4: (80, 10), 8: (80, 10)}


@pytest.mark.parametrize(
    "seed, key_filter, resolve, delete_mode, fmt, partitions",
    [(0, False, "ranges", "hard", "json", 2), (4, True, "driver", "hard", "json", 1),
     (8, False, "ranges", "hard", "json", 2), (11, True, "ranges", "hard", "json", 1),
     (12, "range", "ranges", "hard", "json", 3), (13, "range", "ranges", "hard", "json", 2),
     (14, False, "ranges", "soft", "json", 2), (15, True, "driver", "soft", "json", 1),
     (16, False, "ranges", "soft", "json", 3), (17, "range", "ranges", "soft", "json", 1),
     (18, False, "driver", "hard", "json", 2), (19, True, "driver", "soft", "json", 2),
     (20, "range", "driver", "hard", "json", 1), (21, False, "ranges", "hard", "avro", 2),
     (22, True, "driver", "soft", "avro", 1), (23, "range", "ranges", "soft", "avro", 2)],
)  # fmt: skip
def test_random_interleavings_and_cuts_match_the_reference_model(
    stack,
    spark,
    tmp_path,
    monkeypatch,
    request,
    seed,
    key_filter,
    resolve,
    delete_mode,
    fmt,
    partitions,
):
    """With `key_filter` every MERGE names its keys in the join condition, as a MERGE
    into a big table does (`"range"`: the range of the key's values, as a MERGE of more
    changes does). The batches (read by Spark, as big ones are) are resolved in tasks
    grouped by key (a batch with a truncate in one task); with `resolve="ranges"` they
    are read and resolved range by range, as a Kafka source's are, and with
    `resolve="driver"` read and resolved by the driver, as small batches are.
    With soft deletes every deleted key's row keeps the value it had when it was
    deleted, whichever batch held its last change."""
    used = set()
    filtered = []
    tuning = MEASURED
    if key_filter:
        filtered = merge_key_filters(monkeypatch)
        tuning = FILTER_EVERY_MERGE
        if key_filter == "range":
            tuning = dataclasses.replace(tuning, key_filter_keys=0)
    rng = random.Random(seed)
    steps, cut = LONG.get(seed, (40, 6))
    # truncates with hard deletes (a truncate keeps soft-deleted rows of keys a batch cut
    # gave rows) in one partition (a snapshot read has no LSN to order it by against a
    # truncate in another partition)
    truncates = delete_mode == "hard" and partitions == 1
    log: list = []  # the versions the records hold: seeds 0 and 4 keep a history too
    history = seed in (0, 4)
    records, states, gones = generate(rng, steps=steps, keys=4, truncates=truncates, log=log)
    name = f"it_rand_{seed}_{uuid.uuid4().hex[:6]}"
    fields = {}
    if fmt == "avro":  # the same records as the Avro converter writes them
        registry = request.getfixturevalue("registry")
        fields["kafka"] = {**yaml.safe_load(DEMO_PIPELINE.read_text())["kafka"], "format": fmt,
                           "schema_registry": {"url": registry.url}}  # fmt: skip
    pipeline = make_pipeline(
        tmp_path,
        name,
        [{"source": "public.items", "delete_mode": delete_mode, "history": history}],
        **fields,
    )
    topic = pipeline.topic_for(pipeline.tables[0])
    if fmt == "avro":
        avro = as_avro([(k, v) for k, v, _ in records], registry, topic)
        records = [(k, v, h) for (k, v), (_, _, h) in zip(avro, records, strict=True)]
    spread = placed(records, partitions)
    cuts = sorted(rng.sample(range(1, len(records)), cut)) + [len(records)]
    start = 0
    for i, end in enumerate(cuts):
        results = load_slice(spark, pipeline, f"{name}-{i}", spread[start:end], resolve, tuning)
        used.update(r.resolved_by for r in results)
        # after every batch the lake is the source as of the last record read: a re-sent
        # older record never shows through, not even for one batch
        rows = spark.table(pipeline.qualified_target(pipeline.tables[0])).collect()
        lake = {r["id"]: r["name"] for r in rows if not r.asDict().get("_cdc_deleted")}
        assert lake == states[end - 1], f"seed {seed}: batch {i} ({start}..{end}) of {cuts}"
        if delete_mode == "soft":
            dead = {r["id"]: r["name"] for r in rows if r["_cdc_deleted"]}
            assert dead == gones[end - 1], f"seed {seed}: batch {i} ({start}..{end}) of {cuts}"
        if history and partitions == 1:  # one partition: a cut is a point in source order
            assert history_rows(spark, pipeline) == versions(log, end), f"batch {i} of {cuts}"
        start = end
    if history:
        assert history_rows(spark, pipeline) == versions(log, len(records))
    if key_filter:  # the filter was there (batches with a truncate go without)
        assert any(f for f in filtered), filtered
        ranged = {isinstance(v, KeyRange) for f in filtered if f for v in f.values()}
        assert ranged == {key_filter == "range"}, filtered
    assert used == {resolve}, used


def _resent_batches(gone: str):
    """Key 1 is created then removed (deleted, or the table truncated) and key 2 created;
    the connector restarts and re-sends key 1's insert, and the rest of the re-sent
    stream falls into the next batch; then key 1 is really inserted again."""
    v = value_record
    created = (key_record(1), v("c", None, item(1, "a"), lsn=110))
    if gone == "delete":
        removed = [(key_record(1), v("d", item(1, "a"), None, lsn=120)), (key_record(1), None)]
    else:
        removed = [(None, v("t", None, None, lsn=120))]
    other = (key_record(2), v("c", None, item(2, "b"), lsn=130))
    batches = [
        [created, *removed, other],
        [created],  # re-sent after a restart
        [*removed, other],  # the rest of the re-sent stream
        [(key_record(1), v("c", None, item(1, "again"), lsn=140))],  # a real new insert
    ]
    return batches, [{2: "b"}, {2: "b"}, {2: "b"}, {1: "again", 2: "b"}]


@pytest.mark.parametrize("resolve", ["driver", "ranges"])
def test_a_resent_delete_does_not_remove_the_row_inserted_again_after_it(
    stack, spark, tmp_path, resolve
):
    """The connector restarts and re-sends a delete (and its tombstone) of a key that was
    inserted again after it: the batch's latest record of the key is the tombstone,
    which is checked with the LSN of its delete, so the newer row stays."""
    v = value_record
    deleted = [(key_record(1), v("d", item(1, "a"), None, lsn=120)), (key_record(1), None)]
    batches = [
        [(key_record(1), v("c", None, item(1, "a"), lsn=110)), *deleted,
         (key_record(1), v("c", None, item(1, "again"), lsn=130))],
        deleted,  # re-sent after a restart
    ]  # fmt: skip
    name = f"it_redelete_{resolve}_{uuid.uuid4().hex[:6]}"
    pipeline = make_pipeline(tmp_path, name, ["public.items"])
    start, used = 0, set()
    for i, batch in enumerate(batches):
        end = start + len(batch)
        raw = records_source(batch, start)
        used.update(r.resolved_by for r in load_one(spark, pipeline, f"{name}-{i}", raw,
                                                     start, end, resolve))  # fmt: skip
        assert lake_names(spark, pipeline) == {1: "again"}, f"after batch {i}"
        start = end
    assert used == {resolve}, used


def test_a_key_in_two_partitions_is_read_again_in_one_task(stack, spark, tmp_path):
    """Records of one key in two partitions (a topic given more partitions, or records
    routed by something else than the key): each range alone would give the key a row,
    so the topic's ranges are read again, folded in one task in partition order; the
    later change wins."""
    v = value_record
    parts = {
        0: [(key_record(1), v("c", None, item(1, "first"), lsn=110)),
            (key_record(2), v("c", None, item(2, "two"), lsn=120))],
        1: [(key_record(3), v("c", None, item(3, "three"), lsn=125)),
            (key_record(1), v("u", None, item(1, "second"), lsn=130))],
    }  # fmt: skip

    def reader(r: dict):
        rows = RawRows(r["topic"], r["partition"])
        for off, (k, value) in enumerate(parts[r["partition"]]):
            if r["start"] <= off < r["end"]:
                rows.add(off, 0, k, value)
        yield rows.batch()

    name = f"it_twoparts_{uuid.uuid4().hex[:6]}"
    pipeline = make_pipeline(tmp_path, name, ["public.items"])
    topic = pipeline.topic_for(pipeline.tables[0])
    ranges = tuple(OffsetRange(topic, p, 0, len(recs)) for p, recs in parts.items())
    (result,) = run_batch(spark, pipeline, BatchPlan(pipeline.name, f"{name}-0", ranges),
                          read=RawSource(lambda kafka: reader),
                          placement=Placement.RANGES)  # fmt: skip
    assert result.resolved_by == "ranges" and result.upserts == 3
    assert lake_names(spark, pipeline) == {1: "second", 2: "two", 3: "three"}
    assert stray_files(spark, pipeline.qualified_target(pipeline.tables[0])) == []


@pytest.mark.parametrize("where", ["task", "head"])
def test_a_topic_whose_ranges_fail_fails_its_table_with_the_cause(stack, spark, tmp_path,
                                                                  where):  # fmt: skip
    """A read of the range-by-range path that fails (here the source's first read of the
    partition in a task, or the driver's read of the ranges' head) fails the table with
    that error, nothing written: the topic is not read again another way. The next run
    loads it."""
    from pyspark import TaskContext

    v = value_record
    records = [(key_record(k), v("c", None, item(k, f"n{k}"), lsn=100 + k)) for k in range(4)]
    marker = tmp_path / "failed-once"

    def reader(r: dict):
        in_task = TaskContext.get() is not None
        if not marker.exists() and in_task == (where == "task"):
            marker.touch()
            raise RuntimeError("the broker went away")
        yield from read(r)

    name = f"it_rangefail_{uuid.uuid4().hex[:6]}"
    pipeline = make_pipeline(tmp_path, name, ["public.items"])
    read = records_source(records).open(pipeline.kafka)
    topic = pipeline.topic_for(pipeline.tables[0])
    plan = BatchPlan(pipeline.name, f"{name}-0", (OffsetRange(topic, 0, 0, len(records)),))
    source = RawSource(lambda kafka: reader)
    with pytest.raises(Exception, match="the broker went away"):
        run_batch(spark, pipeline, plan, read=source, placement=Placement.RANGES)
    assert marker.exists()
    assert not spark.catalog.tableExists(pipeline.qualified_target(pipeline.tables[0])) or (
        lake_names(spark, pipeline) == {}
    )
    (result,) = run_batch(spark, pipeline, plan, read=source, placement=Placement.RANGES)
    assert result.resolved_by == "ranges" and result.upserts == 4
    assert lake_names(spark, pipeline) == {k: f"n{k}" for k in range(4)}


@pytest.mark.parametrize("gone", ["delete", "truncate"])
@pytest.mark.parametrize("delete_mode", ["hard", "soft"])
def test_a_resent_insert_of_a_key_removed_in_an_earlier_batch_stays_removed(
    stack, spark, tmp_path, delete_mode, gone
):
    batches, expected = _resent_batches(gone)
    name = f"it_resent_{delete_mode}_{gone}_{uuid.uuid4().hex[:6]}"
    pipeline = make_pipeline(
        tmp_path, name, [{"source": "public.items", "delete_mode": delete_mode}]
    )
    table = pipeline.tables[0]
    start = 0
    for i, (batch, want) in enumerate(zip(batches, expected, strict=True)):
        load_one(spark, pipeline, f"{name}-{i}", records_source(batch, start), start,
                 start + len(batch))  # fmt: skip
        rows = spark.table(pipeline.qualified_target(table)).collect()
        lake = {r["id"]: r["name"] for r in rows if not r.asDict().get("_cdc_deleted")}
        assert lake == want, f"{delete_mode} {gone}: after batch {i}"
        start += len(batch)


@pytest.mark.parametrize(
    "delete_mode, placement",
    [("hard", "driver"), ("hard", "ranges"), ("soft", "driver")],
)
def test_a_batch_of_a_truncate_alone_applies_it_once(
    stack, spark, tmp_path, delete_mode, placement
):
    """A batch whose only record is a truncate (it carries no key) empties the table; the
    connector restarts and sends it again: the rows loaded since (an incremental
    snapshot's read, which has no LSN) stay, whether the re-send comes alone, after a
    read in its batch, or in the batch of the truncate itself."""
    v = value_record
    truncate = (None, v("t", None, None, lsn=140))
    newer = (None, v("t", None, None, lsn=160))

    def read(k: int, name: str):  # a snapshot's read
        return (key_record(k), v("r", None, item(k, name), lsn=None))

    batches = [
        [(key_record(1), v("c", None, item(1, "a"), lsn=110)),
         (key_record(3), v("c", None, item(3, "c"), lsn=130))],
        [truncate],
        [read(2, "b")],
        [truncate],  # re-sent after a restart
        [read(4, "d"), truncate],
        [newer, read(5, "e"), newer],
    ]  # fmt: skip
    expected = [{1: "a", 3: "c"}, {}, {2: "b"}, {2: "b"}, {2: "b", 4: "d"}, {5: "e"}]
    name = f"it_truncate_alone_{delete_mode}_{placement}_{uuid.uuid4().hex[:6]}"
    pipeline = make_pipeline(
        tmp_path, name, [{"source": "public.items", "delete_mode": delete_mode}]
    )
    start, truncated = 0, []
    for i, (batch, want) in enumerate(zip(batches, expected, strict=True)):
        (result,) = load_one(spark, pipeline, f"{name}-{i}", records_source(batch, start),
                             start, start + len(batch), placement)  # fmt: skip
        truncated.append(result.truncated)
        start += len(batch)
        rows = spark.table(pipeline.qualified_target(pipeline.tables[0])).collect()
        lake = {r["id"]: r["name"] for r in rows if not r.asDict().get("_cdc_deleted")}
        assert lake == want, f"after batch {i}"
    assert truncated == [False, True, False, False, False, True]  # each applied once


def test_a_table_that_cannot_be_created_fails_its_load(stack, spark, tmp_path):
    """A new table's creation that fails after its ranges resolved (here a partition
    column the source does not have) fails the table's load with the creation's own
    error, naming the table; nothing is written."""
    v = value_record
    records = [(key_record(k), v("c", None, item(k, f"n{k}"), lsn=100 + k)) for k in range(3)]
    name = f"it_nocreate_{uuid.uuid4().hex[:6]}"
    pipeline = make_pipeline(
        tmp_path, name, [{"source": "public.items", "partition_by": ["no_such_column"]}]
    )
    target = pipeline.qualified_target(pipeline.tables[0])
    with pytest.raises(Exception, match="no_such_column") as failed:
        load_one(spark, pipeline, f"{name}-0", records_source(records), 0, len(records))
    assert any(target in n for n in failed.value.__notes__), failed.value.__notes__
    assert not spark.catalog.tableExists(target)


@pytest.mark.parametrize("names", [["region"], ["region", "n"]], ids=["text", "two columns"])
def test_text_and_two_column_keys_filter_the_merge_and_match_the_model(
    stack, spark, tmp_path, monkeypatch, names
):
    """Every MERGE names the values of each key column in its join condition (as a MERGE
    into a big table does), for a text key and a key of a text and an integer column,
    with key texts holding a quote, a backslash and non-ASCII letters: after every batch
    the lake holds the model's rows, keys outside the batch untouched."""
    import json

    filtered = merge_key_filters(monkeypatch)
    v, rnd = value_record, random.Random(11)
    regions = ["eu", "it's", "a\\b", "ü", "x'\\y"]
    model: dict[tuple, str] = {}
    name = f"it_textkey_{uuid.uuid4().hex[:6]}"
    pipeline = make_pipeline(tmp_path, name, ["public.pairs"])
    topic = pipeline.topic_for(pipeline.tables[0])
    target = pipeline.qualified_target(pipeline.tables[0])
    start, lsn = 0, 0
    for batch in range(4):
        records = []
        for _ in range(12):
            lsn += 1
            row = {"region": rnd.choice(regions), "n": rnd.randint(1, 3), "note": f"v{lsn}"}
            key = tuple(row[n] for n in names)
            k = pair_key(row, names)
            if key in model and rnd.random() < 0.25:
                records += [(k, v("d", row, None, lsn=lsn, columns=PAIR_COLUMNS)), (k, None)]
                del model[key]
            else:
                op = "u" if key in model else "c"
                records.append((k, v(op, None, row, lsn=lsn, columns=PAIR_COLUMNS)))
                model[key] = json.dumps(row, sort_keys=True)
        end = start + len(records)
        plan = BatchPlan(pipeline.name, f"{name}-{batch}", (OffsetRange(topic, 0, start, end),))
        run_batch(
            spark, pipeline, plan, read=records_source(records, start), tuning=FILTER_EVERY_MERGE
        )
        rows = spark.table(target).collect()
        lake = {
            tuple(r[n] for n in names): json.dumps(
                {c: r[c] for c in ("region", "n", "note")}, sort_keys=True
            )
            for r in rows
        }
        # one row a key: a key the filter left out would have been inserted a second time
        assert lake == model and len(rows) == len(lake), f"after batch {batch}"
        start = end
    used = [f for f in filtered if f]
    assert used and all(set(f) == set(names) for f in used), filtered
    assert any("it's" in f["region"] or "a\\b" in f["region"] for f in used), used


def test_a_key_change_resent_after_its_create_keeps_the_value_as_of_it(stack, spark, tmp_path):
    """Key 1's key changes to 5 with `name` unchanged; its delete is loaded a batch before
    the create, which then comes with the connector's re-send of key 1's last changes:
    the re-sent delete's state is not known in that batch (key 1's earlier changes are
    loaded), so key 5 takes the value kept when the delete was first loaded."""
    v, p = value_record, TOAST_PLACEHOLDER
    moved = kept_headers([(NEW_KEY_HEADER, key_record(5))])
    old = kept_headers([(OLD_KEY_HEADER, key_record(1))])
    delete = [(key_record(1), v("u", None, item(1, p), lsn=250), None),
              (key_record(1), v("d", item(1, None), None, lsn=300), moved),
              (key_record(1), None, None)]  # fmt: skip
    batches = [
        [(key_record(1), v("c", None, item(1, "v16"), lsn=220), None)],
        delete,
        [(key_record(5), v("c", None, item(5, p), lsn=300), old), *delete],  # and re-sent
    ]
    name = f"it_moveresent_{uuid.uuid4().hex[:6]}"
    pipeline = make_pipeline(tmp_path, name, ["public.items"])
    spread = placed([r for b in batches for r in b], 1)
    start = 0
    for i, batch in enumerate(batches):
        load_slice(spark, pipeline, f"{name}-{i}", spread[start : start + len(batch)], "driver")
        start += len(batch)
    assert lake_names(spark, pipeline) == {5: "v16"}
