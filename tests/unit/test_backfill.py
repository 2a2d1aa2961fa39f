"""Backfill requests and plans: pure functions, no services."""

from __future__ import annotations

import pytest
from cdclake.offsets import PlanMode, Watermarks
from cdclake.pipeline_file import load_pipeline
from cdclake_control.backfill import BackfillError, parse_request, parse_timestamp, plan_backfill

from tests.conftest import DEMO_PIPELINE

T = "demo.inventory.customers"
ORD = "demo.inventory.orders"


@pytest.fixture(scope="module")
def pipeline():
    return load_pipeline(DEMO_PIPELINE)


def no_time(parts, ts):
    raise AssertionError("no timestamp lookup expected")


def plans_for(pipeline, committed, marks, lookup=no_time, **form):
    form = {"tables": ["inventory.customers"], "mode": "replay", "start": "earliest",
            "end": "latest", **form}  # fmt: skip
    request = parse_request(pipeline, **form)
    return plan_backfill(pipeline, request, "bf/run-1", committed, marks, lookup)


def spans(plans):
    out = {}
    for plan in plans:
        for r in plan.ranges:
            lo, hi = out.get((r.topic, r.partition), (r.start, r.end))
            out[(r.topic, r.partition)] = (min(lo, r.start), max(hi, r.end))
    return out


def test_replay_from_earliest_reaches_the_committed_offset(pipeline):
    plans = plans_for(pipeline, {(T, 0): 70}, {(T, 0): Watermarks(0, 100)},
                      end="offsets", end_offsets='{"0": 30}')  # fmt: skip
    # asked for 0..29, but the read goes on to the committed offset so later changes decide
    assert spans(plans) == {(T, 0): (0, 70)}
    assert {p.mode for p in plans} == {PlanMode.REPLAY}
    assert [p.batch_id for p in plans] == ["bf/run-1/0000"]
    assert plans[0].run_prefix == "bf/run-1"


def test_replay_to_latest_and_batches_split_by_the_cap(pipeline):
    small = type(pipeline)(**{**pipeline.__dict__, "max_records_per_batch": 40})
    plans = plans_for(small, {(T, 0): 70}, {(T, 0): Watermarks(10, 100)})
    assert [(r.start, r.end) for p in plans for r in p.ranges] == [(10, 50), (50, 90), (90, 100)]
    assert [p.batch_id[-4:] for p in plans] == ["0000", "0001", "0002"]


def test_replay_may_not_skip_past_the_committed_offset(pipeline):
    with pytest.raises(BackfillError, match="would be skipped"):
        plans_for(pipeline, {(T, 0): 50}, {(T, 0): Watermarks(0, 100)},
                  start="offsets", start_offsets='{"0": 60}')  # fmt: skip


def test_start_before_retention_is_refused(pipeline):
    with pytest.raises(BackfillError, match="deleted by retention"):
        plans_for(pipeline, {(T, 0): 50}, {(T, 0): Watermarks(20, 100)},
                  start="offsets", start_offsets='{"0": 5}')  # fmt: skip


def test_end_beyond_the_partition_is_refused(pipeline):
    with pytest.raises(BackfillError, match="beyond the end"):
        plans_for(pipeline, {(T, 0): 50}, {(T, 0): Watermarks(0, 100)},
                  end="offsets", end_offsets='{"0": 500}')  # fmt: skip


def test_rebuild_reads_everything_and_refuses_a_retention_gap(pipeline):
    plans = plans_for(pipeline, {(T, 0): 50}, {(T, 0): Watermarks(0, 100)}, mode="rebuild")
    assert spans(plans) == {(T, 0): (0, 100)} and plans[0].mode == PlanMode.REBUILD
    with pytest.raises(BackfillError, match="retention"):
        plans_for(pipeline, {(T, 0): 50}, {(T, 0): Watermarks(5, 100)}, mode="rebuild")
    plans = plans_for(pipeline, {}, {(T, 0): Watermarks(5, 100)}, mode="rebuild",
                      accept_retention_gap=True)  # fmt: skip
    assert spans(plans) == {(T, 0): (5, 100)}


def test_rebuild_must_start_at_earliest(pipeline):
    with pytest.raises(BackfillError, match="earliest"):
        plans_for(pipeline, {}, {(T, 0): Watermarks(0, 10)}, mode="rebuild", start="committed")


def test_timestamps_are_resolved_per_partition(pipeline):
    seen = []

    def lookup(parts, ts):
        seen.append(ts)
        return {tp: 40 if ts < 2000 else 60 for tp in parts}

    plans = plans_for(pipeline, {(T, 0): 80}, {(T, 0): Watermarks(0, 100)}, lookup,
                      start="timestamp", start_timestamp="1000", end="timestamp",
                      end_timestamp="1970-01-01T00:00:03+00:00")  # fmt: skip
    assert seen == [1000, 3000]
    assert spans(plans) == {(T, 0): (40, 80)}


def test_offsets_per_table_for_several_tables(pipeline):
    marks = {(T, 0): Watermarks(0, 100), (ORD, 0): Watermarks(0, 10)}
    start = {"customers": {"0": 90}, "inventory.orders": {"0": 5}}
    plans = plans_for(pipeline, {(T, 0): 100, (ORD, 0): 10}, marks,
                      tables=["inventory.customers", "orders"], start="offsets",
                      start_offsets=start)  # fmt: skip
    assert spans(plans) == {(T, 0): (90, 100), (ORD, 0): (5, 10)}


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"tables": ["inventory.nope"]}, "not in pipeline"),
        ({"mode": "redo"}, "mode"),
        ({"start": "yesterday"}, "start"),
        ({"end": "soon"}, "end"),
        ({"start": "offsets", "start_offsets": ""}, "offsets are required"),
        ({"start": "offsets", "start_offsets": "{0: 1}"}, "not valid JSON"),
        ({"start": "offsets", "start_offsets": '{"x": 1}'}, "not a number"),
        ({"start": "offsets", "start_offsets": '{"0": -1}'}, "whole number"),
        ({"start": "offsets", "start_offsets": '{"0": true}'}, "whole number"),
        ({"start": "timestamp", "start_timestamp": ""}, "timestamp is required"),
        ({"start": "timestamp", "start_timestamp": "last tuesday"}, "ISO 8601"),
        (
            {
                "tables": ["inventory.customers", "inventory.orders"],
                "start": "offsets",
                "start_offsets": '{"0": 1}',
            },
            "per table",
        ),  # fmt: skip
        (
            {"start": "offsets", "start_offsets": {"inventory.orders": {"0": 1}}},
            "not being backfilled",
        ),  # fmt: skip
        (
            {
                "start": "timestamp",
                "start_timestamp": "2000",
                "end": "timestamp",
                "end_timestamp": "1000",
            },
            "after end_timestamp",
        ),  # fmt: skip
    ],
)
def test_bad_requests_name_what_is_wrong(pipeline, form, message):
    with pytest.raises(BackfillError, match=message):
        plans_for(pipeline, {(T, 0): 5}, {(T, 0): Watermarks(0, 10), (ORD, 0): Watermarks(0, 10)},
                  **form)  # fmt: skip


def test_unknown_partition_in_offsets_is_refused(pipeline):
    with pytest.raises(BackfillError, match="no partition 3"):
        plans_for(pipeline, {(T, 0): 5}, {(T, 0): Watermarks(0, 10)},
                  start="offsets", start_offsets='{"0": 1, "3": 1}')  # fmt: skip


def test_parse_timestamp_forms():
    assert parse_timestamp("1970-01-01T00:00:01", "t") == 1000  # naive means UTC
    assert parse_timestamp("1970-01-01T01:00:01+01:00", "t") == 1000
    assert parse_timestamp(1234, "t") == 1234
