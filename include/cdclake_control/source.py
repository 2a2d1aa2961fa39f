"""Connections to the captured PostgreSQL database, every one with bounded waits.

libpq waits for a server that accepts the connection but never answers until the
kernel gives up (minutes); `connect_source` gives it the pipeline's `timeouts`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from cdclake.config import TimeoutsConfig, libpq_settings
from cdclake.exceptions import EndpointError

if TYPE_CHECKING:
    import psycopg


def describe_dsn(dsn: str) -> str:
    """Where a libpq connection string points, as host:port/dbname, without its
    credentials (the password never goes into a message)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:  # not readable: connecting says why
        return "an unreadable DSN"
    host = str(params.get("host") or params.get("hostaddr") or os.environ.get("PGHOST", ""))
    port = str(params.get("port") or os.environ.get("PGPORT", "5432"))
    dbname = str(params.get("dbname") or os.environ.get("PGDATABASE", ""))
    where = f"{host or 'the local socket'}:{port}"
    return f"{where}/{dbname}" if dbname else where


def connect_source(
    dsn: str, timeouts: TimeoutsConfig, *, limit_statements: bool = True, **kwargs: Any
) -> psycopg.Connection:
    """A psycopg connection to `dsn` that gives up connecting after `timeouts.connect_s`
    and whose statements the server cancels after `timeouts.request_s` (unless
    `limit_statements` is False: reads of whole tables). The DSN's own `connect_timeout`
    and `statement_timeout` win. Failing to connect is an EndpointError naming the host
    and port and what to check."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:  # its text may quote the password
        raise EndpointError(
            "source database: the connection string cannot be read (libpq's "
            "'host=... port=... dbname=...' or a postgresql:// URI)"
        ) from None
    settings: dict[str, Any] = libpq_settings(timeouts, limit_statements)
    settings["connect_timeout"] = params.get("connect_timeout") or settings["connect_timeout"]
    if params.get("options"):  # a later -c of the same setting (the DSN's) wins
        settings["options"] = f"{settings.get('options', '')} {params['options']}".strip()
    try:
        return psycopg.connect(dsn, **settings, **kwargs)
    except psycopg.OperationalError as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise EndpointError(
            f"source database at {describe_dsn(dsn)} could not be reached (connect timeout "
            f"{settings['connect_timeout']}s): "
            f"{reason} -- check that PostgreSQL runs there and answers this host, and the "
            "connection string (source.dsn, --source-dsn or the source connection); a slow "
            "network may need a larger timeouts.connect_s in the pipeline file"
        ) from exc
