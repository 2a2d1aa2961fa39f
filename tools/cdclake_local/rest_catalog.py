"""An Iceberg REST catalog for the local stack: Apache Iceberg's REST catalog server
(`org.apache.iceberg.rest.RESTCatalogServer`, the fixture Iceberg tests its REST clients
against, from `iceberg-open-api`'s test fixtures; jars from Maven Central, `stack/rest-catalog`)
keeping its catalog in SQLite under the state directory and the tables' files on the local
S3 store (`cdclake_local.objectstore`) through Iceberg's S3FileIO.

The server takes a port, no host, and listens on every interface: it is started through
`stack/rest-catalog/LoopbackRestCatalog.java` (Java's source launcher, which needs a JDK's
compiler), the same server on 127.0.0.1 only; with a JRE alone it runs as it is, with a
warning. It requires no authentication of its clients (it hands a token to any). Its S3
access key reaches it through its environment; its log (INFO would print its properties,
the secret among them) is kept at WARN and readable by its owner only.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from cdclake_local import StackError, maven
from cdclake_local.broker import java
from cdclake_local.objectstore import REGION, LocalObjectStore
from cdclake_local.procs import port_free, running, start_daemon, stop_daemon, wait_started

log = logging.getLogger(__name__)

MAIN = "org.apache.iceberg.rest.RESTCatalogServer"
LAUNCHER = maven.STACK / "rest-catalog" / "LoopbackRestCatalog.java"
HEAP = "-Xmx512m"
START_TIMEOUT_S = 90


class LocalRestCatalog:
    """The REST catalog on `port`, its warehouse `s3://<bucket>/<prefix>` on `store`."""

    def __init__(self, root: Path, port: int, store: LocalObjectStore,
                 bucket: str = "warehouse", prefix: str = "lake") -> None:  # fmt: skip
        self.root = root
        self.port = port
        self.store = store
        self.bucket = bucket
        self.warehouse = f"s3://{bucket}/{prefix}"
        self.pidfile = root / "rest-catalog.pid"
        self.logfile = root / "rest-catalog.log"

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def pid(self) -> int | None:
        return running(self.pidfile)

    def start(self) -> float:
        """Start the S3 store (with the warehouse's bucket) and the catalog unless they
        run; the seconds the catalog took to answer (0 when it already ran)."""
        self.store.start(buckets=(self.bucket,))
        if self.pid() is not None:
            return 0.0
        if not port_free(self.port):
            raise StackError(f"port {self.port} (the local REST catalog) is already in use by "
                             "another process; stop it or choose another port")  # fmt: skip
        self.root.mkdir(parents=True, exist_ok=True)
        self.logfile.touch(mode=0o600, exist_ok=True)
        self.logfile.chmod(0o600)
        cmd = java(HEAP, "-Djava.awt.headless=true",
                   "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                   "-cp", maven.classpath("rest-catalog"), self._main())  # fmt: skip
        started = time.monotonic()
        start_daemon(cmd, self.pidfile, self.logfile, env={**os.environ, **self._settings()})
        wait_started(f"the REST catalog at {self.uri}", self.pidfile, self.logfile,
                     self._answers, START_TIMEOUT_S, step=0.25)  # fmt: skip
        return time.monotonic() - started

    def stop(self) -> bool:
        return stop_daemon(self.pidfile, timeout=20)

    def _main(self) -> str:
        """The loopback launcher when this Java can compile it, else the server's own main."""
        try:
            modules = subprocess.run(java("--list-modules"), capture_output=True, text=True,
                                     timeout=30).stdout  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StackError(f"Java did not run ({exc}): install openjdk-17-jdk-headless") from exc
        if "jdk.compiler" in modules:
            return str(LAUNCHER)
        log.warning("the REST catalog on port %d listens on every interface: its loopback "
                    "launcher needs a JDK (apt-get install openjdk-17-jdk-headless)",
                    self.port)  # fmt: skip
        return MAIN

    def _settings(self) -> dict[str, str]:
        """The server's catalog properties (CATALOG_<name>, `__` for `-`, `_` for `.`)."""
        creds = self.store.credentials
        return {
            "CATALOG_REST_PORT": str(self.port),
            "CATALOG_WAREHOUSE": self.warehouse,
            "CATALOG_URI": f"jdbc:sqlite:{self.root / 'catalog.db'}",
            "CATALOG_IO__IMPL": "org.apache.iceberg.aws.s3.S3FileIO",
            "CATALOG_S3_ENDPOINT": self.store.endpoint,
            "CATALOG_S3_PATH__STYLE__ACCESS": "true",
            "CATALOG_S3_ACCESS__KEY__ID": creds.access_key_id,
            "CATALOG_S3_SECRET__ACCESS__KEY": creds.secret_access_key,
            "CATALOG_CLIENT_REGION": REGION,
        }

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(f"{self.uri}/v1/config", timeout=2).close()
            return True
        except (urllib.error.URLError, OSError):
            return False


# `cdclake local up` starts both with the rest of the stack when CDCLAKE_REST_CATALOG=1
# (the demo keeps the JDBC catalog); their ports from these variables.
ENABLE_ENV = "CDCLAKE_REST_CATALOG"
REST_PORT_ENV, S3_PORT_ENV = "CDCLAKE_REST_CATALOG_PORT", "CDCLAKE_S3_PORT"


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "").strip() == "1"


def stack_rest_catalog(state_dir: Path) -> LocalRestCatalog:
    """The stack's REST catalog and S3 store under `state_dir` (the S3 access key from
    the environment: `cdclake_local.objectstore`)."""
    from cdclake_local.objectstore import S3Credentials

    store = LocalObjectStore(state_dir / "s3", int(os.environ.get(S3_PORT_ENV, "19900")),
                             S3Credentials.from_env())  # fmt: skip
    return LocalRestCatalog(state_dir / "rest-catalog",
                            int(os.environ.get(REST_PORT_ENV, "18181")), store)  # fmt: skip


def stop_stack_rest_catalog(state_dir: Path) -> dict[str, bool]:
    return {
        "rest_catalog": stop_daemon(state_dir / "rest-catalog" / "rest-catalog.pid", timeout=20),
        "s3": stop_daemon(state_dir / "s3" / "s3.pid", timeout=20),
    }
