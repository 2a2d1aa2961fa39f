"""A PostgreSQL server with wal_level=logical, owned by the local stack.

PostgreSQL refuses to run as root, so when the stack runs as root the cluster belongs to
the `postgres` system user (created by the Debian package) and is driven through runuser.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import pwd
import shutil
import subprocess
from pathlib import Path

import psycopg

from cdclake_local import StackError
from cdclake_local.procs import pid_alive, port_in_use, wait_for

log = logging.getLogger(__name__)

_CONF = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{sockdir}'
wal_level = logical
max_wal_senders = 10
max_replication_slots = 10
max_connections = 100
fsync = off
synchronous_commit = off
full_page_writes = off
"""


def find_bindir() -> Path | None:
    """The newest PostgreSQL server bin directory on this machine, if any."""
    if env := os.environ.get("CDCLAKE_PG_BINDIR"):
        return Path(env)
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    if candidates:
        return Path(candidates[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def ensure_installed() -> Path:
    """Find the server binaries, installing the Debian package when we can."""
    bindir = find_bindir()
    if bindir is not None:
        return bindir
    if os.geteuid() == 0 and shutil.which("apt-get"):
        log.info("PostgreSQL server not found; installing the Debian package")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "postgresql", "postgresql-contrib"],
            check=True,
            env=env,
        )
        bindir = find_bindir()
        if bindir is not None:
            return bindir
    raise StackError(
        "PostgreSQL server binaries (initdb, pg_ctl) were not found. Install them with "
        "`sudo apt-get install postgresql` or set CDCLAKE_PG_BINDIR to their directory."
    )


def _postgres_can_reach(path: Path) -> bool:
    """Can the `postgres` user traverse to `path` (or its nearest existing ancestor)?"""
    while not path.exists():
        path = path.parent
    res = subprocess.run(["runuser", "-u", "postgres", "--", "test", "-x", str(path)],
                         capture_output=True)  # fmt: skip
    return res.returncode == 0


class LocalPostgres:
    """The cluster lives under `root`, unless the stack runs as root and the `postgres`
    user cannot reach that directory (a checkout under /root, say): then it lives under
    /var/lib/cdclake/<hash of root>, and `root/location` records where."""

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.marker = root / "location"  # where the cluster lives, once it was made
        self.port = port
        self.home = self._home()
        self.data = self.home / "data"
        self.sockdir = self.home / "run"
        self.logfile = self.home / "postgres.log"

    def _home(self) -> Path:
        if self.marker.exists():
            return Path(self.marker.read_text().strip())
        if os.geteuid() != 0:
            return self.root
        self._owner()
        if _postgres_can_reach(self.root):
            return self.root
        digest = hashlib.sha1(str(self.root.resolve()).encode()).hexdigest()[:12]
        return Path("/var/lib/cdclake") / digest

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def dsn_for(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _owner(self) -> str | None:
        if os.geteuid() != 0:
            return None
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/bin/false", "postgres"],
                check=True,
            )
        return "postgres"

    def _run(self, bindir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(bindir / args[0]), *args[1:]]
        owner = self._owner()
        if owner:
            cmd = ["runuser", "-u", owner, "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True)

    def is_ready(self) -> bool:
        try:
            with psycopg.connect(self.dsn, connect_timeout=2) as conn:
                conn.execute("select 1")
            return True
        except psycopg.Error:
            return False

    def running(self) -> bool:
        """Our own cluster (by its postmaster.pid) is up, not just anything on the port."""
        pid = self.pid()
        return pid is not None and pid_alive(pid) and self.is_ready()

    def start(self) -> None:
        if not self.marker.exists():
            self._discard_orphan()
        if self.running():
            return
        if port_in_use(self.port):
            raise StackError(
                f"port {self.port} is already in use by another process; stop it or choose "
                "another port with CDCLAKE_PG_PORT"
            )
        bindir = ensure_installed()
        self.root.mkdir(parents=True, exist_ok=True)
        self.marker.write_text(f"{self.home}\n")
        self.home.mkdir(parents=True, exist_ok=True)
        self.sockdir.mkdir(exist_ok=True)
        owner = self._owner()
        if owner:
            shutil.chown(self.home, owner)
            shutil.chown(self.sockdir, owner)
            self.logfile.touch()
            shutil.chown(self.logfile, owner)
        if not (self.data / "PG_VERSION").exists():
            res = self._run(
                bindir, "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                "-E", "UTF8", "--locale=C.UTF-8", check=False,
            )  # fmt: skip
            if res.returncode != 0:
                raise StackError(f"initdb failed: {res.stderr.strip() or res.stdout.strip()}")
            with open(self.data / "postgresql.conf", "a") as fh:
                fh.write(_CONF.format(port=self.port, sockdir=self.sockdir))
        res = self._run(
            bindir, "pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-w", "-t", "60",
            "start", check=False,
        )  # fmt: skip
        if res.returncode != 0:
            raise StackError(
                f"PostgreSQL did not start on 127.0.0.1:{self.port}: "
                f"{res.stderr.strip() or res.stdout.strip()} (log: {self.logfile})"
            )
        wait_for(f"PostgreSQL on 127.0.0.1:{self.port}", self.is_ready, 60, self.logfile)

    def _discard_orphan(self) -> None:
        """A new state directory whose cluster lives elsewhere finds there the cluster of an
        earlier, deleted state directory at the same path: no stack owns it any more, and
        its data is not this stack's. It is stopped and removed."""
        if self.home == self.root or not self.home.exists():
            return
        log.info("removing %s, the cluster of an earlier state directory %s", self.home, self.root)
        self.stop()
        shutil.rmtree(self.home)

    def stop(self) -> bool:
        if not (self.data / "postmaster.pid").exists():
            return False
        bindir = find_bindir()
        if bindir is None:
            return False
        self._run(bindir, "pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)
        return True

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().splitlines()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None

    def ensure_database(self, name: str) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            exists = conn.execute(
                "select 1 from pg_database where datname = %s", (name,)
            ).fetchone()
            if not exists:
                conn.execute(f'create database "{name}"')
