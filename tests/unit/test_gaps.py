"""Healing a retention gap (`cdclake_control.gaps`): what a plan decides, without the
network (the snapshot's state is given)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from cdclake.config import OnGap
from cdclake.exceptions import ConfigError, DataLossError
from cdclake.job import _healed_gaps
from cdclake.offsets import (
    SUMMARY_HEAL,
    SUMMARY_HEALED,
    BatchPlan,
    Heal,
    OffsetRange,
    Watermarks,
    plans_from_json,
)
from cdclake_control.catalog import TableState
from cdclake_control.gaps import Snapshot, heal_gaps, heal_status, with_heals
from cdclake_control.planner import plan_batch

HEAL = Heal("sig-1", 1_000, ((0, 3, 10),), {0: 25}, {0: 7})


@pytest.fixture
def one_table(pipeline):
    """The demo pipeline cut to its first table; its topic and the table's source name."""
    table = pipeline.tables[0]
    return dataclasses.replace(pipeline, tables=(table,)), pipeline.topic_for(table), table.source


def test_a_heal_goes_through_the_plan_json_unchanged():
    plan = BatchPlan("demo", "b1", (OffsetRange("t", 0, 10, 20),), heal={"s.t": HEAL})
    assert plans_from_json(plan.to_json()) == [plan]
    assert plans_from_json(BatchPlan("demo", "b2", ()).to_json())[0].heal == {}


def test_without_resnapshot_a_gap_is_left_to_the_plan_which_refuses_it(one_table):
    pipeline, topic, name = one_table
    marks = {(topic, 0): Watermarks(10, 20)}
    states = {name: TableState(True, {(topic, 0): 3}, {}, None)}
    committed, heals = heal_gaps(pipeline, states, marks, {}, None)
    assert heals == {} and committed == {(topic, 0): 3}
    with pytest.raises(DataLossError, match="on_gap: resnapshot"):
        plan_batch(committed, marks, 100)


def test_resnapshot_without_a_source_database_says_what_to_set(one_table):
    pipeline, topic, name = one_table
    pipeline = dataclasses.replace(pipeline, on_gap=OnGap.RESNAPSHOT)
    states = {name: TableState(True, {(topic, 0): 3}, {}, None)}
    with pytest.raises(ConfigError, match="source.conn_id's Airflow connection"):
        heal_gaps(pipeline, states, {(topic, 0): Watermarks(10, 20)}, {}, None)


@pytest.mark.parametrize(
    "snapshot, ranges_end, sweeps",
    [
        (Snapshot.RUNNING, 30, False),  # not done
        (Snapshot.COMPLETED, 28, False),  # done, but the batch stops short of the end
        (Snapshot.COMPLETED, 30, True),
    ],
)
def test_a_pending_heal_sweeps_once_done_and_read_to_the_end(
    one_table, snapshot, ranges_end, sweeps
):
    pipeline, topic, name = one_table
    marks = {(topic, 0): Watermarks(10, 30)}
    states = {name: TableState(True, {(topic, 0): 20}, {}, None)}
    pending = {name: (HEAL, snapshot)}
    committed, heals = heal_gaps(pipeline, states, marks, pending, None)
    assert committed == {(topic, 0): 20} and heals[name].signal_id == "sig-1"
    ranges = (OffsetRange(topic, 0, 20, ranges_end),)
    healed, planned = with_heals(pipeline, heals, pending, ranges, marks, committed)
    assert healed[name].sweep is sweeps and planned == ranges


def test_a_table_with_nothing_to_read_gets_empty_ranges_to_sweep_in(one_table):
    pipeline, topic, name = one_table
    marks = {(topic, 0): Watermarks(10, 20)}
    committed = {(topic, 0): 20}
    pending = {name: (HEAL, Snapshot.COMPLETED)}
    done = {name: dataclasses.replace(HEAL, sweep=True)}
    healed, planned = with_heals(pipeline, done, pending, (), marks, committed)
    assert healed[name].sweep and planned == (OffsetRange(topic, 0, 20, 20),)
    running = {name: HEAL}  # pending, not done: nothing to commit
    assert with_heals(pipeline, running, pending, (), marks, committed)[1] == ()


def test_the_load_takes_a_healed_gap_s_log_start_for_the_committed_offset(one_table):
    pipeline, topic, name = one_table
    table = pipeline.tables[0]
    plan = BatchPlan("demo", "b1", (OffsetRange(topic, 0, 10, 20),), heal={name: HEAL})
    assert _healed_gaps(plan, table, {(topic, 0): 3}) == {(topic, 0): 10}
    # a later batch of the same heal: the offsets are past the gap already
    assert _healed_gaps(plan, table, {(topic, 0): 15}) == {(topic, 0): 15}
    assert _healed_gaps(dataclasses.replace(plan, heal={}), table, {(topic, 0): 3}) == {
        (topic, 0): 3
    }


def test_the_status_says_healing_until_the_commit_that_sweeps_says_healed():
    text = json.dumps(HEAL.to_dict())
    assert heal_status({}, 5) is None
    assert heal_status({SUMMARY_HEAL: text}, 5) == (
        "healing since 1970-01-01 00:00:01 UTC (snapshot sig-1)"
    )
    assert heal_status({SUMMARY_HEALED: text}, 7_000) == "healed at 1970-01-01 00:00:07 UTC"
