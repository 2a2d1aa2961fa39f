"""The JVM parts of the local stack, from Maven Central.

Each part is a POM under `stack/<part>/` that pins its versions; its jars are copied by
Maven (`dependency:copy-dependencies`) into one folder per POM content under the jar
cache (`CDCLAKE_JVM_CACHE`, by default `~/.cache/cdclake/jvm`), once: a changed
POM resolves into a new folder. Maven comes from the machine, or from Debian's packages
when it is missing and we run as root.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

from cdclake.jvm import cache_home

from cdclake_local import StackError

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
STACK = PROJECT_ROOT / "stack"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
RESOLVE_TIMEOUT_S = 1200  # a first download of every part takes about a minute


def cache_root() -> Path:
    return Path(os.environ.get("CDCLAKE_JVM_CACHE", cache_home() / "jvm")).absolute()


def pom(part: str) -> Path:
    path = STACK / part / "pom.xml"
    if not path.is_file():
        raise StackError(f"no POM for the stack's part {part!r}: {path} is missing")
    return path


def jars(part: str) -> Path:
    """The folder holding every jar of `part` (resolved now when it is not yet)."""
    source = pom(part)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    root = cache_root()
    target = root / f"{part}-{digest}"
    if (target / ".complete").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{part}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may resolve the same part
        if not (target / ".complete").exists():
            _resolve(source, target)
    return target


def classpath(*parts: str) -> str:
    """A Java class path of every jar of `parts`."""
    return os.pathsep.join(str(jars(p) / "*") for p in parts)


def maven() -> str:
    """The `mvn` command, installed from Debian's packages when missing and we are root."""
    mvn = shutil.which("mvn")
    if mvn is None and os.geteuid() == 0 and shutil.which("apt-get"):
        log.info("Maven not found; installing the Debian package")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "maven"]):
            subprocess.run(cmd, check=True, env=env, timeout=RESOLVE_TIMEOUT_S)
        mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError(
            "the local stack's Kafka, Kafka Connect and Iceberg jars come from Maven Central "
            "through Maven, which is not installed: apt-get install maven"
        )
    return mvn


def _resolve(source: Path, target: Path) -> None:
    mvn = maven()
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    cmd = [mvn, "-B", "-q", "-f", str(source), f"{DEPENDENCY_PLUGIN}:copy-dependencies",
           f"-DoutputDirectory={partial}", "-DincludeScope=runtime"]  # fmt: skip
    log.info("resolving %s from Maven Central into %s", source, target)
    run(cmd, f"resolve {source}")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    (target / ".complete").write_text(" ".join(cmd) + "\n")


def run(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    """Run a Maven command, bounded; `StackError` saying it could not `what`, with the
    end of its output."""
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                              timeout=RESOLVE_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"Maven did not {what} in {RESOLVE_TIMEOUT_S}s") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise StackError(f"Maven could not {what} (exit {done.returncode}):\n{tail}")
