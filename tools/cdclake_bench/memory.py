"""Peak memory of a process tree (the `memory` step's figure): PSS summed over the
processes, sampled while the command runs."""

from __future__ import annotations

import dataclasses
import subprocess
import time


@dataclasses.dataclass
class Peak:
    """Peak memory of a process tree, in bytes: the summed proportional set size (each
    shared page split among the processes that map it, so the pages forked Python
    workers share with their daemon count once) and the summed resident set size."""

    pss: int = 0
    rss: int = 0


def _pss(pid: int) -> int | None:
    """The process's proportional set size (Linux `smaps_rollup`), or None."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def tree_memory(pid: int) -> Peak:
    """The summed PSS (RSS where the kernel has none) and RSS of a process and all its
    descendants, now."""
    import psutil

    top = psutil.Process(pid)
    pss = rss = 0
    for p in [top, *top.children(recursive=True)]:
        try:
            resident = p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
        rss += resident
        proportional = _pss(p.pid)
        pss += resident if proportional is None else proportional
    return Peak(pss, rss)


def peak_memory(cmd: list[str]) -> tuple[Peak, str]:
    """Run `cmd`; the peak memory of it and all its descendants (JVM, Python workers),
    sampled every 0.2 s, and its output. Where the kernel has no PSS, RSS stands in."""
    import psutil

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = Peak()
    while proc.poll() is None:
        try:
            now = tree_memory(proc.pid)
            peak = Peak(max(peak.pss, now.pss), max(peak.rss, now.rss))
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.2)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} failed: {err[-2000:]}")
    return peak, out
