"""The retention arithmetic that keeps the snapshot holding the committed offsets."""

from __future__ import annotations

import pytest
from cdclake.exceptions import MaintenanceError
from cdclake.iceberg.maintenance import check_offsets_kept, expiry_bounds

HOUR = 3_600_000


@pytest.mark.parametrize(
    "ancestry, cutoff, retain, expected",
    [
        # the current snapshot holds the offsets: settings apply unchanged
        ([(100 * HOUR, True)], 90 * HOUR, 5, (90 * HOUR, 5)),
        # two compactions on top of the last load: retain reaches down to the load
        ([(100 * HOUR, False), (99 * HOUR, False), (98 * HOUR, True)], 99 * HOUR, 1,
         (98 * HOUR, 3)),
        # an idle table: its last load is older than the cutoff, which moves back to it
        ([(500 * HOUR, False), (10 * HOUR, True)], 380 * HOUR, 1, (10 * HOUR, 2)),
        # retain_last larger than needed is kept
        ([(100 * HOUR, False), (99 * HOUR, True)], 50 * HOUR, 10, (50 * HOUR, 10)),
        # no offsets anywhere (a table never loaded): settings apply unchanged
        ([(100 * HOUR, False)], 50 * HOUR, 1, (50 * HOUR, 1)),
        ([], 50 * HOUR, 1, (50 * HOUR, 1)),  # no snapshot at all
    ],
)  # fmt: skip
def test_expiry_bounds_keep_the_offsets_snapshot(ancestry, cutoff, retain, expected):
    assert expiry_bounds(ancestry, cutoff, retain) == expected


@pytest.mark.parametrize(
    "after",
    [
        {("t", 0): 10, ("t", 1): 5},  # unchanged
        {("t", 0): 12, ("t", 1): 5},  # a load committed meanwhile
        {("t", 0): 10, ("t", 1): 5, ("t", 2): 1},  # ... and read a new partition
    ],
)
def test_offsets_may_stay_or_advance(after):
    check_offsets_kept("lake.ns.t", "expire_snapshots", {("t", 0): 10, ("t", 1): 5}, after)


@pytest.mark.parametrize(
    "after",
    [
        {},  # the walk found no offsets: the next load would start at the earliest
        {("t", 0): 10},  # a partition went missing
        {("t", 0): 9, ("t", 1): 5},  # went back
    ],
)
def test_offsets_lost_or_moved_back_stop_maintenance(after):
    with pytest.raises(MaintenanceError, match=r"lake\.ns\.t: after rewrite_data_files"):
        check_offsets_kept("lake.ns.t", "rewrite_data_files", {("t", 0): 10, ("t", 1): 5}, after)
