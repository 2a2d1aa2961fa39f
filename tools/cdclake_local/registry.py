"""A schema registry for the local stack's Avro connectors: Apicurio Registry 2.4.2, which
serves the Confluent-compatible API at `/apis/ccompat/v7` (what cdclake reads) beside its
own at `/apis/registry/v2` (what Apicurio's Avro converter writes to), keeping its schemas
in memory, on 127.0.0.1 only.

Maven Central holds Apicurio Registry's modules, not the server built from them: Quarkus
builds it here from `stack/registry` (about a minute and 300 MB of jars the first time,
kept in the jar cache), with a stand-in for the one build module Central lacks
(`stack/registry/config-index-deployment`). The registry has no login without an OpenID
provider: it listens on loopback only, like the stack's PostgreSQL.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

from cdclake_local import StackError, maven
from cdclake_local.broker import java
from cdclake_local.procs import port_free, running, start_daemon, stop_daemon, wait_started

log = logging.getLogger(__name__)

SOURCE = maven.STACK / "registry"
RUNNER = "registry-2.4.2-runner.jar"
START_TIMEOUT_S = 120


def runner() -> Path:
    """The registry's runner jar (its `lib/` beside it), built now when it is not yet."""
    files = sorted(p for p in SOURCE.rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(SOURCE)).encode() + b"\0" + path.read_bytes())
    root = maven.cache_root()
    target = root / f"registry-{digest.hexdigest()[:12]}"
    if not (target / ".complete").exists():
        root.mkdir(parents=True, exist_ok=True)
        with open(root / "registry.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may build it too
            if not (target / ".complete").exists():
                _build(target)
    return target / RUNNER


def _build(target: Path) -> None:
    build = target.with_name(target.name + ".build")
    shutil.rmtree(build, ignore_errors=True)
    shutil.copytree(SOURCE, build)
    # a repository of its own: the stand-in must not reach the user's ~/.m2
    mvn = [maven.maven(), "-B", "-q", "-s", str(build / "settings.xml"),
           f"-Dmaven.repo.local={target.with_name('registry-m2')}"]  # fmt: skip
    log.info("building the schema registry from Maven Central into %s", target)
    for folder, goal in ((build / "config-index-deployment", "install"), (build, "package")):
        maven.run([*mvn, goal], f"build {folder}", cwd=folder)
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    (build / "target" / RUNNER).rename(target / RUNNER)
    (build / "target" / "lib").rename(target / "lib")
    shutil.rmtree(build)
    (target / ".complete").write_text("built\n")


class LocalRegistry:
    """The registry on 127.0.0.1:`port`."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port = root, port
        self.pidfile = root / "registry.pid"
        self.logfile = root / "registry.log"

    @property
    def url(self) -> str:
        """The Confluent-compatible API: a pipeline's `kafka.schema_registry.url`."""
        return f"http://127.0.0.1:{self.port}/apis/ccompat/v7"

    def converter_config(self, side: str) -> dict[str, str]:
        """A connector's settings for Apicurio's Avro converter on `side` (key or value),
        writing the Confluent wire format with the ids the compatible API serves."""
        prefix = f"{side}.converter"
        return {
            prefix: "io.apicurio.registry.utils.converter.AvroConverter",
            f"{prefix}.apicurio.registry.url": f"http://127.0.0.1:{self.port}/apis/registry/v2",
            f"{prefix}.apicurio.registry.auto-register": "true",
            f"{prefix}.apicurio.registry.as-confluent": "true",
            f"{prefix}.apicurio.registry.use-id": "contentId",
            f"{prefix}.apicurio.registry.headers.enabled": "false",
        }

    def start(self) -> float:
        """Start it unless it runs; the seconds it took to answer (0 when it ran)."""
        if running(self.pidfile) is not None:
            return 0.0
        jar = runner()
        if not port_free(self.port):
            raise StackError(f"port {self.port} (the local schema registry) is in use by "
                             f"another process; stop it or set {PORT_ENV}")  # fmt: skip
        self.root.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HTTP_PORT": str(self.port), "QUARKUS_HTTP_HOST": "127.0.0.1"}
        started = time.monotonic()
        start_daemon(java("-Xmx384m", "-jar", str(jar)), self.pidfile, self.logfile, env=env)
        wait_started(f"the schema registry at {self.url}", self.pidfile, self.logfile,
                     self._answers, START_TIMEOUT_S, step=0.25)  # fmt: skip
        return time.monotonic() - started

    def stop(self) -> bool:
        return stop_daemon(self.pidfile, timeout=20)

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(f"{self.url}/subjects", timeout=2).close()
            return True
        except (urllib.error.URLError, OSError):
            return False


PORT_ENV = "CDCLAKE_REGISTRY_PORT"


def stack_registry(state_dir: Path) -> LocalRegistry:
    return LocalRegistry(state_dir / "registry", int(os.environ.get(PORT_ENV, "18081")))
