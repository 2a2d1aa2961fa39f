"""The local default stack: PostgreSQL, Apache Kafka (KRaft), Debezium on Kafka Connect,
an Iceberg JDBC catalog and an AIRFLOW_HOME, all on loopback under one state directory."""

import os
from pathlib import Path

from cdclake.exceptions import CdclakeError


def cache_home() -> Path:
    """Where the stack's downloaded and built parts are kept, for every clone and run
    (each named by its content or version): `$XDG_CACHE_HOME/cdclake`, by default
    `~/.cache/cdclake`, beside the Spark driver's class-data-sharing archive."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cdclake"


class StackError(CdclakeError):
    """The local stack could not be started, stopped or inspected."""
