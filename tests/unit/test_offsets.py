import re

import pytest
from cdclake.exceptions import ConfigError, DataLossError
from cdclake.offsets import (
    BatchPlan,
    OffsetRange,
    PlanMode,
    Watermarks,
    decode_offsets,
    encode_offsets,
    plans_from_json,
)
from cdclake_control.planner import plan_batch, share_cap

A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)


def test_unloaded_partition_starts_at_earliest_offset():
    ranges = plan_batch({}, {A0: Watermarks(5, 20)}, 100)
    assert ranges == (OffsetRange("a", 0, 5, 20),)


def test_committed_partition_continues_where_it_stopped():
    ranges = plan_batch({A0: 12}, {A0: Watermarks(0, 20)}, 100)
    assert ranges == (OffsetRange("a", 0, 12, 20),)


def test_partitions_with_nothing_new_are_left_out():
    assert plan_batch({A0: 20}, {A0: Watermarks(0, 20)}, 100) == ()


def test_cap_takes_small_backlogs_whole_and_splits_the_rest():
    marks = {A0: Watermarks(0, 1000), A1: Watermarks(0, 3), B0: Watermarks(0, 1000)}
    ranges = plan_batch({}, marks, 103)
    sizes = {(r.topic, r.partition): r.size for r in ranges}
    assert sizes == {A0: 50, A1: 3, B0: 50}
    assert sum(sizes.values()) == 103


@pytest.mark.parametrize(
    "backlog, cap, expected",
    [
        ({A0: 10, A1: 10}, 100, {A0: 10, A1: 10}),  # everything fits
        ({A0: 10, A1: 10}, 7, {A0: 3, A1: 4}),  # even split, remainder to the later one
        ({A0: 1, A1: 100, B0: 100}, 11, {A0: 1, A1: 5, B0: 5}),  # tiny one whole
    ],
)
def test_share_cap(backlog, cap, expected):
    assert share_cap(backlog, cap) == expected


def test_retention_gap_fails_loudly_with_recovery_hint():
    with pytest.raises(DataLossError) as err:
        plan_batch({A0: 3}, {A0: Watermarks(10, 20)}, 100)
    msg = str(err.value)
    assert "a partition 0" in msg and "3" in msg and "10" in msg
    assert "incremental snapshot" in msg


def test_committed_offset_beyond_the_end_is_an_error():
    with pytest.raises(DataLossError, match="beyond the end"):
        plan_batch({A0: 30}, {A0: Watermarks(0, 20)}, 100)


def test_offsets_round_trip_through_the_snapshot_summary_text():
    offsets = {A0: 7, A1: 9, B0: 0}
    assert decode_offsets(encode_offsets(offsets)) == offsets


def test_plan_round_trips_through_json():
    plan = BatchPlan("demo", "run-1", (OffsetRange("a", 0, 1, 5), OffsetRange("b", 2, 0, 3)))
    [again] = plans_from_json(plan.to_json())
    assert again == plan
    assert again.total == 7


def test_a_plan_or_a_list_of_plans_is_read_from_json():
    one = BatchPlan("demo", "run-1", (OffsetRange("a", 0, 1, 5),))
    two = BatchPlan("demo", "run-1/2", (), mode=PlanMode.REPLAY)
    assert plans_from_json(one.to_json()) == [one]
    listed = f"[{one.to_json()}, {two.to_json()}]"
    assert plans_from_json(listed) == [one, two]
    assert plans_from_json("[]") == []


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{not json", "not JSON"),
        ('"a plan"', "a JSON object (or a list of them), not str"),
        ("[1]", "not int"),
        ('{"pipeline": "p", "ranges": []}', "needs ['batch_id']"),
        ('{"pipeline": "p", "batch_id": "b", "ranges": {}}', "ranges must be a list"),
        (
            '{"pipeline": "p", "batch_id": "b", "ranges": [{"topic": "t", "partition": 0, '
            '"start": "1", "end": 5}]}',
            "integer offsets",
        ),
        (
            '{"pipeline": "p", "batch_id": "b", "ranges": [{"topic": "t", "start": 1, "end": 5}]}',
            "'b': ranges must be",
        ),
        (
            '{"pipeline": "p", "batch_id": "b", "ranges": [], "mode": "again"}',
            "'b': unknown mode 'again' (one of ['load', 'replay', 'rebuild'])",
        ),
    ],
)
def test_a_bad_plan_is_refused_saying_what_is_wrong(text, said):
    with pytest.raises(ConfigError, match=re.escape(said)):
        plans_from_json(text)
