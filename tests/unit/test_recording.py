"""Benchmark recordings split into two batches of one history."""

from __future__ import annotations

import json

from cdclake.offsets import OffsetRange
from cdclake_bench.sources import split_recording


def test_a_recording_named_by_a_relative_path_splits_into_halves_whose_files_open(
    tmp_path, monkeypatch
):
    """`make bench` passes a relative work directory; each half's links must still reach
    the recorded files (they were relative to the link's own folder, and broken)."""
    monkeypatch.chdir(tmp_path)
    rec = tmp_path / "work" / "recording"
    rec.mkdir(parents=True)
    (rec / "t-0.parquet").write_bytes(b"recorded")
    ranges = [OffsetRange("t", 0, 0, 10)]

    first, second = split_recording(rec.relative_to(tmp_path), ranges)

    assert (first / "t-0.parquet").read_bytes() == b"recorded"
    assert (second / "t-0.parquet").read_bytes() == b"recorded"
    assert json.loads((first / "ranges.json").read_text()) == [["t", 0, 0, 5]]
    assert json.loads((second / "ranges.json").read_text()) == [["t", 0, 5, 10]]
