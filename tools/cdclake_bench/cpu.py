"""Where a batch's CPU goes: CPU seconds of a process tree (the Python driver, its Spark
JVM, Spark's Python daemon and workers) by part, from Linux's per-thread counters.

A snapshot (`cpu_snapshot`) reads every thread's user and system time once; the
difference of two (`cpu_parts`) is what each part used between them. It reads nothing
while the batch runs, so it costs the batch nothing. A thread that ended between the
two snapshots is counted through its process's total: under its process's part, or, for
the JVM's, "JVM threads ended in the batch".
"""

from __future__ import annotations

import os
from pathlib import Path

# the parts, in the order a report lists them
PARTS = (
    "Python workers",
    "JVM executor tasks",
    "JVM compilers",
    "JVM garbage collector",
    "JVM driver and other threads",
    "Python driver",
    "other processes",
)

Snapshot = dict[tuple[int, int | None], tuple[str, float]]


def thread_part(process: str, thread: str) -> str:
    """The part of a thread named `thread` (the kernel's 15-character name) in a process
    of kind `process` ("jvm", "python worker", "driver", "other")."""
    if process == "jvm":
        if thread.startswith("Executor task"):
            return "JVM executor tasks"
        if thread.startswith(("C1 Compiler", "C2 Compiler")):
            return "JVM compilers"
        if thread.startswith(("GC Thread", "G1 ")):
            return "JVM garbage collector"
        return "JVM driver and other threads"
    return {"python worker": "Python workers", "driver": "Python driver"}.get(
        process, "other processes"
    )


def process_kind(pid: int, top: int) -> str:
    """ "driver" for the tree's top, "jvm" for a Java process, "python worker" for Spark's
    Python daemon and the workers it forks, else "other"."""
    if pid == top:
        return "driver"
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "other"
    if name == "java":
        return "jvm"
    if b"pyspark.daemon" in cmdline or b"pyspark.worker" in cmdline:
        return "python worker"
    return "other"


def _times(stat: str) -> tuple[str, float]:
    """(name, user + system seconds) of a `/proc/.../stat` line."""
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    return name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_snapshot(top: int) -> Snapshot:
    """Each thread's part and CPU seconds so far, for `top` and all its descendants;
    (pid, None) holds a process's own total (its ended threads included). Empty where
    the system has no `/proc`."""
    import psutil

    try:
        root = psutil.Process(top)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    out: Snapshot = {}
    for p in procs:
        kind = process_kind(p.pid, top)
        try:
            _, total = _times(Path(f"/proc/{p.pid}/stat").read_text())
            tids = [int(t) for t in os.listdir(f"/proc/{p.pid}/task")]
        except (OSError, ValueError):
            continue
        out[(p.pid, None)] = (thread_part(kind, ""), total)
        for tid in tids:
            try:
                name, used = _times(Path(f"/proc/{p.pid}/task/{tid}/stat").read_text())
            except (OSError, ValueError):
                continue
            out[(p.pid, tid)] = (thread_part(kind, name), used)
    return out


def cpu_parts(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds per part between two snapshots of one tree (a process or thread new
    since `before` counts from zero), rounded to 0.01 s; parts that used none are left
    out. A process's threads that ended in between count under its process's part, the
    JVM's under a part of their own."""
    parts: dict[str, float] = {}
    threads: dict[int, float] = {}
    for (pid, tid), (part, used) in after.items():
        if tid is None:
            continue
        spent = used - before.get((pid, tid), (part, 0.0))[1]
        parts[part] = parts.get(part, 0.0) + spent
        threads[pid] = threads.get(pid, 0.0) + spent
    for (pid, tid), (part, used) in after.items():
        if tid is not None:
            continue
        gone = used - before.get((pid, None), (part, 0.0))[1] - threads.get(pid, 0.0)
        if gone > 0.005:
            name = "JVM threads ended in the batch" if part.startswith("JVM") else part
            parts[name] = parts.get(name, 0.0) + gone
    return {k: round(v, 2) for k, v in sorted(parts.items(), key=_order) if round(v, 2) > 0}


def _order(item: tuple[str, float]) -> tuple[int, str]:
    name = item[0]
    return (PARTS.index(name) if name in PARTS else len(PARTS), name)


def render_parts(parts: dict[str, float], cores: int | None = None) -> str:
    """`parts` as one line: each part's CPU seconds and the total; with `cores` (those
    the batch's processes shared), the wall that much CPU takes at the least."""
    total = sum(parts.values())
    shown = ", ".join(f"{name} {seconds:,.1f}s" for name, seconds in parts.items())
    floor = f", at least {total / cores:,.1f}s of wall on {cores} cores" if cores else ""
    return f"{shown}; {total:,.1f} CPU s in all{floor}"
