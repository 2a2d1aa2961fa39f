"""Freshness arithmetic and the terminal table: pure functions, no services."""

from __future__ import annotations

import json

import pytest
from cdclake.iceberg.snapshots import live_rows
from cdclake.offsets import BatchPlan, OffsetRange, Watermarks
from cdclake_control.freshness import TableFreshness, format_seconds, render_freshness
from cdclake_control.lag import (
    offsets_behind,
    oldest_per_topic,
    record_time_ms,
    seconds_behind_source,
    source_time_ms,
    unloaded_starts,
)
from cdclake_control.report import TableReport, batches_by_topic, sum_counts


@pytest.mark.parametrize(
    "summary, expected",
    [
        ({"total-records": "50"}, 50),  # append-only table
        ({"total-records": "60", "total-position-deletes": "15"}, 45),  # merge-on-read
        ({"total-records": "60", "total-position-deletes": "15",
          "total-equality-deletes": "0"}, 45),  # zero equality deletes: still exact
        ({"total-records": "60", "total-equality-deletes": "3"}, None),  # unknown count
        ({}, None),  # a snapshot without totals
    ],
)  # fmt: skip
def test_live_rows(summary, expected):
    assert live_rows(summary) == expected


MARKS = {("t", 0): Watermarks(0, 10), ("t", 1): Watermarks(5, 8), ("u", 0): Watermarks(0, 99)}


@pytest.mark.parametrize(
    "committed, expected",
    [
        ({("t", 0): 10, ("t", 1): 8}, 0),  # caught up
        ({("t", 0): 4, ("t", 1): 8}, 6),  # one partition behind
        ({("t", 0): 4}, 6 + 3),  # partition 1 never committed: counted from its low mark
        ({}, 10 + 3),  # nothing committed
        ({("t", 0): 12, ("t", 1): 8}, 0),  # committed past the high mark is not negative
    ],
)
def test_offsets_behind_counts_only_the_topic(committed, expected):
    assert offsets_behind(MARKS, "t", committed) == expected


@pytest.mark.parametrize(
    "committed, expected",
    [
        ({("t", 0): 10, ("t", 1): 8, ("u", 0): 99}, {}),  # caught up: nothing to read
        ({("t", 0): 4, ("t", 1): 8, ("u", 0): 99}, {("t", 0): 4}),  # the first unloaded
        ({("t", 0): 10, ("t", 1): 2, ("u", 0): 99}, {("t", 1): 5}),  # retention passed it
        ({}, {("t", 0): 0, ("t", 1): 5, ("u", 0): 0}),  # nothing committed: the low marks
        ({("t", 0): 12, ("t", 1): 8, ("u", 0): 99}, {}),  # past the high mark
    ],
)
def test_unloaded_starts(committed, expected):
    assert unloaded_starts(MARKS, committed) == expected


def envelope(source: dict | None, schema: bool = True) -> bytes:
    payload = {"before": None, "after": {"id": 1}, "op": "c", "ts_ms": 9_999, "source": source}
    return json.dumps({"schema": {}, "payload": payload} if schema else payload).encode()


CREATE_TIME = (1, 5_000)  # confluent-kafka: (TIMESTAMP_CREATE_TIME, ms)


@pytest.mark.parametrize(
    "value, kafka_ts, expected",
    [
        (envelope({"ts_ms": 1_000, "lsn": 5}), CREATE_TIME, 1_000),  # the source commit time,
        # not Debezium's processing time (payload.ts_ms) nor Kafka's
        (envelope({"ts_ms": 1_000}, schema=False), CREATE_TIME, 1_000),  # schemas disabled
        (json.dumps({"id": 1, "__source_ts_ms": 2_000}).encode(), CREATE_TIME, 2_000),  # flat
        (None, CREATE_TIME, 5_000),  # a tombstone: Kafka's time
        (b"\x00\x01 not json", CREATE_TIME, 5_000),  # undecodable: Kafka's time
        (envelope({"ts_ms": None}), CREATE_TIME, 5_000),  # no source time
        (envelope({"ts_ms": True}), CREATE_TIME, 5_000),  # not a number
        (json.dumps([1, 2]).encode(), CREATE_TIME, 5_000),  # not an object
        (None, (0, -1), None),  # no time at all: unknown
    ],
)
def test_record_time_ms(value, kafka_ts, expected):
    assert record_time_ms(value, kafka_ts) == expected


def test_source_time_ms_of_a_tombstone_is_none():
    assert source_time_ms(None) is None and source_time_ms(b"") is None


@pytest.mark.parametrize(
    "times, expected",
    [
        ({("t", 0): 3_000, ("t", 1): 1_000, ("u", 0): 7}, {"t": 1_000, "u": 7}),  # oldest
        ({("t", 0): 3_000, ("t", 1): None}, {"t": None}),  # one unknown: unknown
        ({}, {}),
    ],
)
def test_oldest_per_topic(times, expected):
    assert oldest_per_topic(times) == expected


@pytest.mark.parametrize(
    "oldest, waiting, now, expected",
    [
        (None, False, 61_000, 0.0),  # caught up: as fresh as the source
        (1_000, True, 61_000, 60.0),  # the oldest unloaded change is a minute old
        (1_000, True, 500, 0.0),  # clock skew never gives a negative lag
        (None, True, 61_000, None),  # waiting, time unknown
    ],
)
def test_seconds_behind_source(oldest, waiting, now, expected):
    assert seconds_behind_source(oldest, waiting, now) == expected


def test_batches_by_topic_names_each_batch_that_read_a_topic():
    plans = [
        BatchPlan("p", "bf/r/0000", (OffsetRange("t", 0, 0, 5), OffsetRange("u", 0, 0, 5))),
        BatchPlan("p", "bf/r/0001", (OffsetRange("t", 0, 5, 9),)),
    ]
    assert batches_by_topic(plans) == {"t": {"bf/r/0000", "bf/r/0001"}, "u": {"bf/r/0000"}}
    assert batches_by_topic([]) == {}


def test_sum_counts_over_a_runs_snapshots():
    summaries = [
        {"cdclake.records": "7", "cdclake.upserts": "5", "cdclake.deletes": "1"},
        {"cdclake.records": "3", "cdclake.upserts": "3"},  # no deletes recorded
    ]
    assert sum_counts(summaries) == (10, 8, 1)
    assert sum_counts([]) == (0, 0, 0)


@pytest.mark.parametrize(
    "records, loaded, changed",
    [
        (0, False, False),  # not in the run's plans
        (0, True, False),  # a commit that carried no records
        (3, True, True),
    ],
)
def test_a_table_changed_when_the_run_loaded_records_into_it(records, loaded, changed):
    rep = TableReport("lake.p.t", True, "b", loaded, records, records, 0, 0, None, 0.0)
    assert rep.changed is changed


@pytest.mark.parametrize(
    "seconds, text",
    [(None, "-"), (0.0, "0s"), (119.4, "119s"), (600, "10m"), (7200, "2.0h"), (259200, "3.0d")],
)
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text


def test_render_aligns_columns_and_marks_tables_not_created():
    rows = [
        TableFreshness("p", "lake.p.orders", "s.orders", True, 0, 1234, 5.0, 1_000_000, "b-1"),
        TableFreshness("p", "lake.p.x", "s.x", False, None, 7, None, None, None),
    ]
    lines = render_freshness(rows).splitlines()
    assert lines[0].split("  ")[0] == "TABLE"
    assert "1970-01-01 00:00:00 UTC" in lines[1] and "1,000,000" in lines[1]
    assert "not created yet" in lines[2]
    end = lines[0].index("OFFSETS BEHIND") + len("OFFSETS BEHIND")  # right-aligned
    assert [line[end - 5 : end] for line in lines[1:]] == ["1,234", "    7"]


def page_views():
    from cdclake_airflow.freshness_page import DagState, PipelineView, run_path

    run = "scheduled__2026-11-26T08:05:00+00:00"
    table = TableFreshness("p", "lake.p.t", "s.t", True, 0, 3, 42.0, 10, f"cdclake__p/{run}")
    return [
        PipelineView("p", "cdclake__p", {"run_id": run, "state": "success", "run_after": None,
                     "end_date": None, "url": run_path("cdclake__p", run)}, [table],
                     dag_state=DagState.ACTIVE),
        PipelineView("q", "cdclake__q", None, [], dag_state=DagState.PAUSED),
        PipelineView("r", "cdclake__r", None, [], dag_state=DagState.MISSING),
    ]  # fmt: skip


def test_page_links_the_dag_and_its_last_run_and_shows_paused_and_missing_dags():
    import re

    from cdclake_airflow.freshness_page import render_page

    body = render_page(page_views(), 0)
    sections = dict(re.findall(r"<section><h2>(\w) (.*?)</section>", body))
    run_href = "../dags/cdclake__p/runs/scheduled__2026-11-26T08:05:00+00:00"
    # relative to /cdclake/freshness: the UI's /dags/<dag_id> and /dags/<dag_id>/runs/<run_id>
    assert '<a href="../dags/cdclake__p" target="_top" class="ui">cdclake__p</a>' in sections["p"]
    assert f'<a href="{run_href}" target="_top"' in sections["p"]
    assert sections["p"].count(f'href="{run_href}"') == 2  # the last run and the batch cell
    assert ">active</span>" in sections["p"] and ">42s</span>" in sections["p"]
    assert ">paused: no scheduled loads</span>" in sections["q"]
    assert 'href="../dags/cdclake__q"' in sections["q"]
    assert ">DAG missing: nothing loads this pipeline</span>" in sections["r"]
    assert 'href="../dags/cdclake__r"' not in sections["r"]  # no page to link to


def test_run_path_keeps_a_run_id_in_one_path_segment():
    from cdclake_airflow.freshness_page import dag_path, run_path

    assert dag_path("cdclake__p") == "/dags/cdclake__p"
    assert (
        run_path("cdclake__p", "manual__a/b?c#d") == "/dags/cdclake__p/runs/manual__a%2Fb%3Fc%23d"
    )


def test_a_report_says_what_the_run_did_in_one_line_and_when_in_iso():
    rep = TableReport("lake.p.t", True, "b", True, 5, 4, 1, 3, 1_764_403_200_250, 2.04)
    assert rep.to_dict()["committed_at"] == "2025-11-29T08:00:00.250Z"
    assert rep.to_dict()["committed_at_ms"] == 1_764_403_200_250  # kept for machines
    assert rep.summary() == (
        "lake.p.t: 5 records loaded (4 upserts, 1 deletes); 3 offsets behind Kafka; "
        "offsets committed at 2025-11-29T08:00:00.250Z; 2.0 s behind the source"
    )
    quiet = TableReport("lake.p.t", True, "b", False, 0, 0, 0, 0, None, None)
    assert quiet.summary() == "lake.p.t: nothing new loaded; 0 offsets behind Kafka"
    missing = TableReport("lake.p.u", False, None, False, 0, 0, 0, 0, None, None)
    assert missing.summary() == "lake.p.u: not created yet (no change loaded)"
    assert missing.to_dict()["committed_at"] is None
