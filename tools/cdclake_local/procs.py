"""Background processes started by the local stack, tracked by pid files (and each
process's start time beside, so that a pid taken by another process since is never
signalled)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from cdclake_local import StackError

log = logging.getLogger(__name__)


def write_private(path: Path, text: str) -> Path:
    """Replace `path` with `text`, readable by its owner only (it holds secrets)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def secret(path: Path) -> str:
    """The random secret kept in `path`, made once (the first writer wins when several
    processes make it at once), readable by its owner only."""
    if not path.exists():
        import secrets

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = write_private(path.with_name(f".{path.name}.{os.getpid()}.new"),
                            secrets.token_urlsafe(24))  # fmt: skip
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_text().strip()


def read_pid(pidfile: Path) -> int | None:
    """The pid `pidfile` records, if that process is still the one started (`start_daemon`
    records its start time in `<pidfile>.started`): None when the file is missing or the
    pid now belongs to another process."""
    try:
        pid = int(pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        started = _started_file(pidfile).read_text().strip()
    except FileNotFoundError:  # a pid file of an older cdclake
        return pid
    return pid if _start_time(pid) == started else None


def _started_file(pidfile: Path) -> Path:
    return pidfile.with_name(pidfile.name + ".started")


def _start_time(pid: int) -> str | None:
    """When process `pid` started (psutil's create time, as text), None when there is none."""
    import psutil

    try:
        return repr(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child still answers kill(0); treat it as gone
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def running(pidfile: Path) -> int | None:
    pid = read_pid(pidfile)
    return pid if pid is not None and pid_alive(pid) else None


def start_daemon(
    cmd: Sequence[str], pidfile: Path, logfile: Path, env: Mapping[str, str] | None = None
) -> int:
    """Start `cmd` in its own session (so `down` can stop its whole process group)."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "ab") as out:
        proc = subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    pidfile.write_text(str(proc.pid))
    _started_file(pidfile).write_text(str(_start_time(proc.pid)))
    log.info("started %s (pid %d), log %s", Path(cmd[0]).name, proc.pid, logfile)
    return proc.pid


def stop_daemon(pidfile: Path, timeout: float = 20.0) -> bool:
    """Stop the process group recorded in `pidfile`; SIGKILL after `timeout`. True if stopped."""
    pid = running(pidfile)
    if pid is None:
        pidfile.unlink(missing_ok=True)
        _started_file(pidfile).unlink(missing_ok=True)
        return False
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _group_alive(pid):
            _reap(pid)
            time.sleep(0.1)
        if not _group_alive(pid):
            break
    pidfile.unlink(missing_ok=True)
    _started_file(pidfile).unlink(missing_ok=True)
    return True


def processes() -> dict[int, tuple[int, int, bytes]]:
    """Every live process: pid -> (parent pid, process group, command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if fields[0] != "Z":
            found[int(entry.name)] = (int(fields[1]), int(fields[2]), cmdline)
    return found


def _group_alive(pgid: int) -> bool:
    return any(group == pgid for _, group, _ in processes().values())


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def port_free(port: int, timeout: float = 15.0) -> bool:
    """True once nothing listens on `port` (a process just stopped may hold it a moment
    while its last threads exit), False after `timeout`."""
    deadline = time.monotonic() + timeout
    while port_in_use(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def wait_for(what: str, check: Callable[[], bool], timeout: float, logfile: Path | None = None,
             step: float = 0.5):  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(step)
    tail = log_tail(logfile) if logfile is not None else ""
    raise StackError(f"{what} was not ready after {timeout:.0f}s{tail}")


def wait_started(what: str, pidfile: Path, logfile: Path, answers: Callable[[], bool],
                 timeout: float, step: float = 0.5) -> None:  # fmt: skip
    """Wait until the daemon of `pidfile`, just started, `answers`; fail at once, with
    its log's tail, when it exits first."""

    def ready() -> bool:
        if running(pidfile) is None:
            raise StackError(f"{what} exited; see {logfile}{log_tail(logfile)}")
        return answers()

    wait_for(what, ready, timeout, logfile, step)


def log_tail(logfile: Path, lines: int = 30) -> str:
    """The last lines of a log, on lines of their own after a newline ("" if no log)."""
    if not logfile.exists():
        return ""
    return "\n" + "\n".join(logfile.read_text(errors="replace").splitlines()[-lines:])
