"""Keep a PySpark driver from outliving the spark-submit that started it.

In client mode the Python driver is a child of the spark-submit JVM. When Airflow's
SparkSubmitOperator times out or is killed, it stops spark-submit only, and the Python
process would go on as an orphan (holding memory and, worse, possibly committing after
the task was marked failed). The driver asks the kernel to kill it with its parent, and a
watchdog thread covers kernels without that facility.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from cdclake.exceptions import CdclakeError

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def exit_with_parent(poll_s: float = 1.0) -> None:
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - exotic libc
            log.debug("prctl(PR_SET_PDEATHSIG) unavailable; watchdog only")
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                log.error("spark-submit (pid %d) is gone; stopping this driver", parent)
                os._exit(1)

    threading.Thread(target=watch, name="cdclake-parent-watch", daemon=True).start()


def run_job(
    parser: argparse.ArgumentParser,
    work: Callable[[argparse.Namespace], None],
    argv: list[str] | None = None,
) -> int:
    """What every spark-submit entry point does around its work: parse the arguments, die
    with spark-submit, log to stderr, and turn a cdclake error into its message and exit
    status 2."""
    args = parser.parse_args(argv)
    exit_with_parent()  # a killed spark-submit (task timeout, manual kill) takes us along
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)  # a line per closed connection
    try:
        work(args)
    except CdclakeError as exc:
        print(f"cdclake: error: {exc}", file=sys.stderr)
        return 2
    return 0
