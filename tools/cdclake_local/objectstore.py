"""An S3-compatible object store for the local stack: the Versity S3 Gateway (versitygw,
Apache-2.0) serving a folder over the S3 API on loopback, requests signed with one access
key (AWS Signature V4; anonymous requests are refused).

The gateway is a Go program built once from the Go module proxy (`go install`, about 4
minutes on 2 cores) into the Go cache (`CDCLAKE_GO_CACHE`, by default `~/.cache/cdclake/go`);
the build's module and compile caches are removed afterwards, only the binary is
kept. Go comes from the machine (`/usr/local/go/bin/go` or the `PATH`).

The access key comes from the environment (`CDCLAKE_S3_ACCESS_KEY_ID`,
`CDCLAKE_S3_SECRET_ACCESS_KEY`): the gateway gets it in its environment, never on its
command line, and nothing here prints it. Pipelines name the same variables
(`${CDCLAKE_S3_SECRET_ACCESS_KEY}`) in their catalog properties.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import stat
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from cdclake.jvm import cache_home

from cdclake_local import StackError
from cdclake_local.procs import port_free, running, start_daemon, stop_daemon, wait_started

log = logging.getLogger(__name__)

MODULE = "github.com/versity/versitygw"
VERSION = "v1.8.0"
BUILD_TIMEOUT_S = 900  # measured 173 s (115 CPU s) on a busy 2-core machine, downloads included
START_TIMEOUT_S = 30
ACCESS_KEY_ENV = "CDCLAKE_S3_ACCESS_KEY_ID"
SECRET_KEY_ENV = "CDCLAKE_S3_SECRET_ACCESS_KEY"
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Credentials:
    access_key_id: str
    secret_access_key: str = field(repr=False)

    @classmethod
    def from_env(cls) -> S3Credentials:
        key, secret = os.environ.get(ACCESS_KEY_ENV, ""), os.environ.get(SECRET_KEY_ENV, "")
        if not key or len(secret) < 8:
            raise StackError(
                f"the local S3 store requires an access key: set {ACCESS_KEY_ENV} and "
                f"{SECRET_KEY_ENV} (a secret of at least 8 characters) in the environment"
            )
        return cls(key, secret)


def go_cache() -> Path:
    return Path(os.environ.get("CDCLAKE_GO_CACHE", cache_home() / "go")).absolute()


def gateway_binary() -> Path:
    """The versitygw binary, built now when it is not yet (once per version)."""
    target = go_cache() / f"versitygw-{VERSION}" / "versitygw"
    if target.is_file():
        return target
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    with open(go_cache() / "versitygw.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may build the same version
        if not target.is_file():
            _build(target)
    return target


def _go() -> str:
    found = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(found).is_file():
        raise StackError(
            f"the local S3 store ({MODULE}) is built with Go, which is not installed: "
            "install Go 1.24 or later (go.dev/dl, or apt-get install golang-go)"
        )
    return found


def _build(target: Path) -> None:
    work = target.parent.with_name(target.parent.name + ".build")
    _remove(work)
    env = {**os.environ, "GOPATH": str(work / "gopath"), "GOMODCACHE": str(work / "mod"),
           "GOCACHE": str(work / "cache"), "GOBIN": str(work / "bin"),
           "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}  # fmt: skip
    cmd = [_go(), "install", "-trimpath", "-ldflags=-s -w", f"{MODULE}/cmd/versitygw@{VERSION}"]
    log.info("building %s@%s with Go (once, about 4 minutes)", MODULE, VERSION)
    started = time.monotonic()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        _remove(work)
        raise StackError(f"building {MODULE}@{VERSION} took over {BUILD_TIMEOUT_S}s") from exc
    if done.returncode != 0:
        _remove(work)
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise StackError(f"`go install {MODULE}@{VERSION}` failed (exit {done.returncode}):"
                         f"\n{tail}")  # fmt: skip
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(work / "bin" / "versitygw"), target)
    _remove(work)
    log.info("built %s in %.0fs", target, time.monotonic() - started)


def _remove(path: Path) -> None:
    """Remove a Go build folder (its module cache is read-only)."""
    if not path.exists():
        return
    for dirpath, dirnames, _ in os.walk(path):
        for name in dirnames:
            p = os.path.join(dirpath, name)
            os.chmod(p, os.stat(p).st_mode | stat.S_IWUSR | stat.S_IXUSR | stat.S_IRUSR)
    shutil.rmtree(path, ignore_errors=True)


class LocalObjectStore:
    """versitygw on 127.0.0.1:`port`, its buckets the folders under `root/data`."""

    def __init__(self, root: Path, port: int, credentials: S3Credentials) -> None:
        self.root = root
        self.port = port
        self.credentials = credentials
        self.data = root / "data"
        self.pidfile = root / "s3.pid"
        self.logfile = root / "s3.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def pid(self) -> int | None:
        return running(self.pidfile)

    def start(self, buckets: tuple[str, ...] = ()) -> float:
        """Start the gateway unless it runs, with `buckets` present; the seconds it took
        to answer (0 when it already ran)."""
        for bucket in buckets:
            (self.data / bucket).mkdir(parents=True, exist_ok=True)
        if self.pid() is not None:
            return 0.0
        if not port_free(self.port):
            raise StackError(f"port {self.port} (the local S3 store) is already in use by "
                             "another process; stop it or choose another port")  # fmt: skip
        binary = gateway_binary()
        env = {**os.environ, "ROOT_ACCESS_KEY_ID": self.credentials.access_key_id,
               "ROOT_SECRET_ACCESS_KEY": self.credentials.secret_access_key}  # fmt: skip
        cmd = [str(binary), "--port", f"127.0.0.1:{self.port}", "--region", REGION, "--quiet",
               "posix", str(self.data)]  # fmt: skip
        started = time.monotonic()
        start_daemon(cmd, self.pidfile, self.logfile, env=env)
        wait_started(f"the S3 store at {self.endpoint}", self.pidfile, self.logfile,
                     lambda: _answers(self.endpoint), START_TIMEOUT_S, step=0.1)  # fmt: skip
        return time.monotonic() - started

    def stop(self) -> bool:
        return stop_daemon(self.pidfile, timeout=20)


def _answers(endpoint: str) -> bool:
    """Whether an S3 API answers at `endpoint` (an unsigned request: refused, but answered)."""
    try:
        urllib.request.urlopen(endpoint, timeout=2).close()
        return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
