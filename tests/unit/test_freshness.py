"""Freshness arithmetic and the terminal table: pure functions, no services."""

from __future__ import annotations

import pytest
from cdclake.freshness import TableFreshness, format_seconds, live_rows, render_freshness
from cdclake.offsets import Watermarks
from cdclake.report import offsets_behind, seconds_behind_source


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
    "behind, source_ts, now, expected",
    [
        (0, "1000", 61_000, 0.0),  # caught up: as fresh as the source
        (3, "1000", 61_000, 60.0),  # waiting: age of the newest committed change
        (3, 1000, 500, 0.0),  # clock skew never gives a negative lag
        (3, None, 61_000, None),  # nothing committed yet
    ],
)
def test_seconds_behind_source(behind, source_ts, now, expected):
    assert seconds_behind_source(behind, source_ts, now) == expected


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
