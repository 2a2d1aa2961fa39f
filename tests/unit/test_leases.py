"""Which write leases are dead, and from when on files may belong to a live writer."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from cdclake.iceberg.leases import (
    STALE_S,
    LeaseEntry,
    classify,
    lease_name,
    process_space,
    process_ticks,
    processes_gone,
)

NOW = 10_000_000
SPACE = process_space()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_lease_names_this_process_and_it_is_alive():
    name = lease_name(SPACE, [os.getpid()])
    assert SPACE and name.split("_")[1] == SPACE
    assert name.split("_")[2] == f"{os.getpid()}-{process_ticks(os.getpid())}"
    assert not processes_gone(name, SPACE)


@pytest.mark.parametrize(
    ("owners", "space", "gone"),
    [
        ("dead", SPACE, True),  # the only process exited: a killed load
        ("dead+alive", SPACE, False),  # the JVM (or the driver) still runs
        ("dead", "elsewhere", False),  # another host or pid namespace: cannot tell
        ("reused", SPACE, True),  # the pid runs again, but another process (start ticks)
    ],
)
def test_processes_gone_only_when_seen_from_their_own_process_space(owners, space, gone):
    alive = f"{os.getpid()}-{process_ticks(os.getpid())}"
    parts = {
        "dead": [f"{dead_pid()}-1"],
        "dead+alive": [f"{dead_pid()}-1", alive],
        "reused": [f"{os.getpid()}-{(process_ticks(os.getpid()) or 0) + 1}"],
    }[owners]
    name = "_".join(["abc", SPACE, *parts])
    assert processes_gone(name, space) is gone


def entry(name: str, live_age_s: float | None, start_age_s: float | None) -> LeaseEntry:
    def at(age):
        return None if age is None else NOW - int(age * 1000)

    return LeaseEntry(name, at(live_age_s), at(start_age_s))


@pytest.mark.parametrize(
    ("entries", "dead", "oldest", "stray"),
    [
        # a live writer that began 30 s ago: its files are younger, nobody is dead
        ([entry("mine", 0, 5), entry("other", 3, 30)], [], 30, []),
        # ended after a failure (no .live): dead; only ours bounds the sweep
        ([entry("mine", 0, 5), entry("failed", None, 50)], ["failed"], 5, []),
        # not renewed for longer than STALE_S: dead (another host's killed load)
        ([entry("mine", 0, 5), entry("stale", STALE_S + 1, STALE_S + 60)], ["stale"], 5, []),
        # renewed just within STALE_S: live, however long ago it began
        ([entry("mine", 0, 5), entry("slow", STALE_S - 1, 5000)], [], 5000, []),
        # a .live alone is being taken or released: live, bounds the sweep by its time
        ([entry("mine", 0, 5), entry("taking", 2, None)], [], 5, []),
        # ... unless stale: a leftover, removed, with no sweep
        ([entry("mine", 0, 5), entry("left", STALE_S + 1, None)], [], 5, ["left"]),
    ],
)
def test_classify_dead_leases_and_the_oldest_live_start(entries, dead, oldest, stray):
    found_dead, found_oldest, found_stray = classify(entries, NOW, "", {"mine"})
    assert [e.name for e in found_dead] == dead
    assert found_oldest == NOW - oldest * 1000
    assert [e.name for e in found_stray] == stray


def test_a_killed_writer_on_this_host_is_dead_at_once():
    killed = "_".join(["abc", SPACE, f"{dead_pid()}-1"])
    entries = [entry("mine", 0, 1), entry(killed, 1, 20)]
    found_dead, oldest, _ = classify(entries, NOW, SPACE, {"mine"})
    assert [e.name for e in found_dead] == [killed] and oldest == NOW - 1000
