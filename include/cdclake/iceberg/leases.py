"""Write leases: which writers of a table may still commit the data files they wrote, so
that the files of a load that died before its commit can be removed without touching
those of a load still at work.

Before it writes a data file into a table, a load (or a maintenance run) takes a lease
on it: two empty files under `<table location>/cdclake-leases/`, named after the lease
(`<uuid>_<process space>_<pid>-<start ticks>_<JVM pid>-<start ticks>`):

- `<lease>.live`, written first and rewritten every `RENEW_S` seconds while it works;
- `<lease>.start`, written next: its time, by the storage's clock, is when it began.
  Every data file it writes is younger.

The writer removes both once it committed, only `.live` when it failed. A lease is dead
when it has `.start` and no `.live`, when its `.live` was not renewed for `STALE_S`, or
when its processes are gone (seen from the same host and process namespace: a SIGKILL
is noticed by the next load at once). Every time is the storage's: the files' own times,
compared with the taker's `.live`, just written.

Taking a lease on a table with dead leases sweeps it: the data files under its data
location (and its deleted-keys ledger's) that no snapshot of it references and that are
older than the oldest live lease's start (Iceberg's DeleteOrphanFiles with that
`olderThan`) cannot be any live writer's, and are deleted; then the dead leases. A
writer that finds its own lease gone (taken for dead) or not renewed for `STALE_S / 2`
does not commit.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from cdclake.exceptions import CommitConflictError, first_line
from cdclake.iceberg.key_changes import key_changes_table
from cdclake.iceberg.tables import (
    deleted_keys_table,
    fresh_table,
    load_iceberg_table,
    spark_actions,
)

log = logging.getLogger(__name__)

LEASE_DIR = "cdclake-leases"
RENEW_S = 10.0  # how often a writer rewrites its `.live`
STALE_S = 600.0  # a `.live` older than this is a dead writer's (another host's)
LIVE, START = ".live", ".start"


@dataclass(frozen=True)
class LeaseEntry:
    """What a listing of the lease directory shows of one lease (times in ms, the
    storage's clock; None: that file is missing)."""

    name: str
    live_ms: int | None
    start_ms: int | None


def process_space() -> str:
    """Who can see this process's pids: host, boot and pid namespace ('' when unknown:
    leases from here are then judged by their age only)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    text = f"{socket.gethostname()}|{boot}|{namespace}"
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def process_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot); None: no such process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[19])


def lease_name(space: str, pids: list[int]) -> str:
    owners = "_".join(f"{p}-{process_ticks(p) or 0}" for p in pids)
    return f"{uuid.uuid4().hex}_{space or 'x'}_{owners}"


def processes_gone(name: str, space: str) -> bool:
    """Whether every process a lease names is gone, when it was taken where this
    process can see its pids (False when it cannot tell)."""
    parts = name.split("_")
    if not space or len(parts) < 3 or parts[1] != space:
        return False
    for owner in parts[2:]:
        pid, _, ticks = owner.partition("-")
        if not pid.isdigit():
            return False
        now = process_ticks(int(pid))
        if now is not None and (ticks == "0" or str(now) == ticks):
            return False
    return True


def classify(entries: list[LeaseEntry], now_ms: int, space: str, held: set[str]):
    """(dead leases, start of the oldest live one or None, stray `.live` files): a lease
    with `.start` is dead without `.live`, with a `.live` older than `STALE_S` or with
    its processes gone; a `.live` alone is a lease being taken or released (live) or,
    stale or orphaned, a leftover holding no data file."""
    dead, starts, stray = [], [], []
    for e in entries:
        if e.name in held:
            starts.append(e.start_ms if e.start_ms is not None else e.live_ms)
            continue
        stale = e.live_ms is None or now_ms - e.live_ms > STALE_S * 1000
        gone = stale or processes_gone(e.name, space)
        if e.start_ms is None:
            if gone:
                stray.append(e)
            else:
                starts.append(e.live_ms)
        elif gone:
            dead.append(e)
        else:
            starts.append(e.start_ms)
    return dead, min(starts) if starts else None, stray


class Leases:
    """The leases one load or maintenance run holds, one per table, renewed by one
    thread until `close`: clean for the tables marked `done`, else left dead."""

    def __init__(self, spark) -> None:
        self.spark = spark
        self.space = process_space()
        self.held: dict[str, _Held] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> Leases:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def take(self, table: str) -> int:
        """Lease `table` for this run (once), sweeping its dead writers' data files;
        how many were removed."""
        with self.lock:
            if table in self.held:
                return 0
        ice = load_iceberg_table(self.spark, table)
        io = ice.io()
        root = f"{str(ice.location()).rstrip('/')}/{LEASE_DIR}"
        held = _Held(table, io, root, lease_name(self.space, self._pids()))
        held.write(LIVE)
        held.write(START)
        try:
            entries = list_leases(io, root)
        except Exception as exc:  # maintenance's orphan removal is what is left
            log.info(
                "%s: no write lease (its FileIO does not list its files: %s)",
                table,
                first_line(exc),
            )
            held.delete(START)
            held.delete(LIVE)
            return 0
        with self.lock:
            self.held[table] = held
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._renew, name="cdclake-leases", daemon=True
                )
                self.thread.start()
        return self._sweep(held, entries)

    def check(self, table: str) -> None:
        """Raise unless this run may commit to `table`: its lease still stands and was
        renewed lately (else a sweep may have taken it for dead)."""
        held = self.held.get(table)
        if held is None:
            return
        late = time.monotonic() - held.renewed > STALE_S / 2
        if late or not held.io.newInputFile(held.path(START)).exists():
            raise CommitConflictError(
                f"{table}: this run's write lease ({held.path(START)}) "
                f"{'was not renewed for a while' if late else 'is gone'}; another run may "
                "have removed its files as a dead load's. Nothing was committed; plan again."
            )

    def alone(self, table: str) -> bool:
        """Whether this run holds the only live lease on `table` (it took one): no other
        load or maintenance run is at work on it."""
        held = self.held.get(table)
        if held is None:
            return False
        entries = list_leases(held.io, held.root)
        mine = next((e for e in entries if e.name == held.name), None)
        if mine is None or mine.live_ms is None:
            return False
        dead, _, stray = classify(entries, mine.live_ms, self.space, {held.name})
        ended = {e.name for e in dead + stray}
        return all(e.name == held.name or e.name in ended for e in entries)

    def done(self, table: str) -> None:
        """This run committed to `table`: its lease ends clean."""
        held = self.held.get(table)
        if held is not None:
            held.clean = True

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=RENEW_S * 3)
        with self.lock:
            held, self.held = list(self.held.values()), {}
        for h in held:
            try:
                if h.clean:
                    h.delete(START)
                h.delete(LIVE)
            except Exception as exc:  # the lease ends dead: the next run sweeps
                log.warning("%s: its write lease was not released: %s", h.table, exc)

    def _pids(self) -> list[int]:
        pids = [os.getpid()]
        try:
            jvm_pid = int(self.spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
        except Exception:  # no JVM process handle: the driver's pid alone
            return pids
        return pids if jvm_pid in pids else [*pids, jvm_pid]

    def _renew(self) -> None:
        while not self.stop.wait(RENEW_S):
            with self.lock:
                held = list(self.held.values())
            for h in held:
                try:
                    h.write(LIVE)
                except Exception as exc:  # `check` refuses the commit once it is late
                    log.warning("%s: write lease not renewed: %s", h.table, exc)

    def _sweep(self, held: _Held, entries: list[LeaseEntry]) -> int:
        mine = next((e for e in entries if e.name == held.name), None)
        if mine is None or mine.live_ms is None:
            return 0
        dead, oldest, stray = classify(entries, mine.live_ms, self.space, {held.name})
        for e in stray:
            _delete(held.io, f"{held.root}/{e.name}{LIVE}")
        if not dead or oldest is None:
            return 0
        removed = 0
        try:
            for table in (
                held.table,
                deleted_keys_table(held.table),
                key_changes_table(held.table),
            ):
                removed += remove_unreferenced(self.spark, table, oldest)
        except Exception as exc:  # the dead leases stay: a later run sweeps again
            log.warning(
                "%s: the files of %d dead load(s) were not removed: %s",
                held.table,
                len(dead),
                first_line(exc),
            )
            return removed
        for e in dead:
            _delete(held.io, f"{held.root}/{e.name}{LIVE}")
            _delete(held.io, f"{held.root}/{e.name}{START}")
        log.info("%s: %d data file(s) of %d dead load(s) removed", held.table, removed, len(dead))
        return removed


@dataclass
class _Held:
    table: str
    io: object
    root: str
    name: str
    clean: bool = False
    renewed: float = 0.0

    def path(self, suffix: str) -> str:
        return f"{self.root}/{self.name}{suffix}"

    def write(self, suffix: str) -> None:
        self.io.newOutputFile(self.path(suffix)).createOrOverwrite().close()
        if suffix == LIVE:
            self.renewed = time.monotonic()

    def delete(self, suffix: str) -> None:
        _delete(self.io, self.path(suffix))


def list_leases(io, root: str) -> list[LeaseEntry]:
    found: dict[str, dict[str, int]] = {}
    for info in java_items(io.listPrefix(root)):
        base = str(info.location()).rstrip("/").rsplit("/", 1)[-1]
        for suffix in (LIVE, START):
            if base.endswith(suffix) and not base.startswith("."):
                found.setdefault(base[: -len(suffix)], {})[suffix] = int(info.createdAtMillis())
    return [LeaseEntry(n, f.get(LIVE), f.get(START)) for n, f in sorted(found.items())]


def remove_unreferenced(spark, table: str, older_than_ms: int) -> int:
    """Delete the files under `table`'s data location that none of its snapshots
    references and that are older than `older_than_ms` (the storage's clock); how many.
    Nothing when the table or its data location does not exist."""
    if not spark.catalog.tableExists(table):
        return 0
    ice = fresh_table(spark, table)
    props = dict(ice.properties())
    location = props.get("write.data.path") or f"{str(ice.location()).rstrip('/')}/data"
    path = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(location)
    hadoop = None if lists_by_prefix(ice) else path.getFileSystem(spark._jsc.hadoopConfiguration())
    if hadoop is not None and not hadoop.exists(path):
        return 0
    return remove_orphans(spark, ice, older_than_ms, location)


def lists_by_prefix(ice) -> bool:
    """Whether the table's files are listed through its own FileIO (an object store's:
    Spark's Hadoop has no FileSystem for s3://) rather than through Hadoop's."""
    return not str(ice.io().getClass().getName()).endswith(".HadoopFileIO")


def remove_orphans(spark, ice, older_than_ms: int, location: str | None = None) -> int:
    """Iceberg's DeleteOrphanFiles on `ice` (under `location`, else all of the table's),
    listing as `lists_by_prefix` says; how many files it deleted."""
    action = spark_actions(spark).deleteOrphanFiles(ice).olderThan(older_than_ms)
    if location is not None:
        action = action.location(location)
    if lists_by_prefix(ice):
        action = action.usePrefixListing(True)
    count = 0
    for path in java_items(action.execute().orphanFileLocations()):
        log.debug("%s: removed %s", ice.name(), path)
        count += 1
    return count


def java_items(iterable) -> Iterator:
    """The items of a Java Iterable, by hasNext/next (py4j's own iteration takes any
    error for the end)."""
    it = iterable.iterator()
    while it.hasNext():
        yield it.next()


def _delete(io, path: str) -> None:
    try:
        io.deleteFile(path)
    except Exception as exc:  # already gone
        log.debug("%s: not deleted: %s", path, exc)
