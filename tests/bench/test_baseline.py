"""The benchmark's baseline column: a revision's files, and how figures compare."""

from __future__ import annotations

import subprocess

import pytest
from cdclake_bench.baseline import REPO, checkout, relative, render_side_by_side


def test_a_checkout_holds_the_revisions_files_once_per_commit(tmp_path):
    tree = checkout("HEAD", tmp_path)
    readme = subprocess.run(["git", "-C", str(REPO), "show", "HEAD:README.md"],
                            capture_output=True, check=True).stdout  # fmt: skip
    assert (tree / "README.md").read_bytes() == readme
    assert (tree / "include" / "cdclake" / "job.py").is_file()
    assert checkout("HEAD", tmp_path) == tree and len(list(tmp_path.iterdir())) == 1


def test_an_unknown_revision_is_named():
    with pytest.raises(ValueError, match="no-such-revision"):
        checkout("no-such-revision", REPO)


def test_above_one_is_better_whichever_way_a_figure_goes():
    assert relative("throughput_eps", 100.0, 120.0) == pytest.approx(1.2)  # more is better
    assert relative("throughput_merge_eps", 100.0, 50.0) == pytest.approx(0.5)
    assert relative("fixed_overhead_s", 10.0, 8.0) == pytest.approx(1.25)  # less is better
    assert relative("memory_ratio", 1.0, 2.0) == pytest.approx(0.5)
    assert relative("fixed_overhead_s", None, 8.0) is None


def test_both_columns_are_printed():
    text = render_side_by_side("abc123", {"throughput_eps": 1000.0, "fixed_overhead_s": 10.0},
                               {"throughput_eps": 900.0, "fixed_overhead_s": 5.0})  # fmt: skip
    lines = {line.split()[0]: line.split()[1:] for line in text.splitlines()[2:]}
    assert lines["throughput_eps"] == ["1,000.00", "900.00", "0.90x"]
    assert lines["fixed_overhead_s"] == ["10.00", "5.00", "2.00x"]
    assert "abc123" in text.splitlines()[0]
