"""The Iceberg catalog from outside Spark (pyiceberg): committed offsets, table state."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import quote as urlquote
from urllib.parse import urlsplit

from cdclake.config import CatalogConfig, PipelineConfig, TableConfig
from cdclake.exceptions import ConfigError, EndpointError
from cdclake.offsets import SUMMARY_OFFSETS, TopicPartition, decode_offsets


def sqlalchemy_uri(catalog: CatalogConfig) -> str:
    """jdbc:postgresql://host:port/db -> postgresql+psycopg://user:password@host:port/db."""
    if not catalog.uri.startswith("jdbc:postgresql://"):
        raise ConfigError(
            f"catalog.uri {catalog.uri!r}: the JDBC catalog is supported on PostgreSQL "
            "(jdbc:postgresql://host:port/db)"
        )
    parts = urlsplit(catalog.uri[len("jdbc:") :])
    user = catalog.properties.get("jdbc.user", "")
    password = catalog.properties.get("jdbc.password", "")
    auth = urlquote(user, safe="")
    if password:
        auth += ":" + urlquote(password, safe="")
    netloc = f"{auth}@{parts.netloc}" if auth else parts.netloc
    return f"postgresql+psycopg://{netloc}{parts.path}"


def load_catalog(catalog: CatalogConfig):
    from pyiceberg.catalog import load_catalog as _load

    props = {k: v for k, v in catalog.properties.items() if not k.startswith("jdbc.")}
    try:
        if catalog.type == "jdbc":
            from pyiceberg.catalog.sql import SqlCatalog

            def connect():
                return SqlCatalog(
                    catalog.name, uri=sqlalchemy_uri(catalog), warehouse=catalog.warehouse, **props
                )

            try:
                return connect()
            except Exception as exc:  # two processes creating the catalog tables at once
                if "UniqueViolation" not in str(exc) and "already exists" not in str(exc):
                    raise
                time.sleep(0.5)
                return connect()
        return _load(catalog.name, type="rest", uri=catalog.uri, warehouse=catalog.warehouse,
                     **props)  # fmt: skip
    except ConfigError:
        raise
    except Exception as exc:
        raise EndpointError(f"Iceberg catalog {catalog.uri} could not be reached: {exc}") from exc


def committed_from_snapshots(summaries: Iterable[dict[str, str]]) -> dict[TopicPartition, int]:
    """Offsets of the newest snapshot (walking back from current) that carries them.

    Maintenance commits (compaction, expiry) carry none, so the walk skips them.
    """
    for summary in summaries:
        if SUMMARY_OFFSETS in summary:
            return decode_offsets(summary[SUMMARY_OFFSETS])
    return {}


def _ancestry_snapshots(table) -> Iterable:
    snap = table.current_snapshot()
    while snap is not None:
        yield snap
        snap = table.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id else None


def _summary(snap) -> dict[str, str]:
    return dict(snap.summary.additional_properties) if snap is not None and snap.summary else {}


def _ancestry(table) -> Iterable[dict[str, str]]:
    return (_summary(s) for s in _ancestry_snapshots(table))


def _offsets_snapshot(table):
    """The newest snapshot (walking back from current) that carries committed offsets."""
    return next((s for s in _ancestry_snapshots(table) if SUMMARY_OFFSETS in _summary(s)), None)


@dataclass(frozen=True)
class TableState:
    exists: bool
    offsets: dict[TopicPartition, int]
    summary: dict[str, str]
    committed_at_ms: int | None
    # The snapshot that committed `offsets` (the current one unless maintenance came after)
    offsets_summary: dict[str, str] = field(default_factory=dict)
    offsets_committed_at_ms: int | None = None


def table_state(cat, pipeline: PipelineConfig, table: TableConfig) -> TableState:
    from pyiceberg.exceptions import NoSuchTableError

    try:
        ice = cat.load_table((pipeline.namespace, table.target))
    except NoSuchTableError:
        return TableState(False, {}, {}, None)
    except Exception as exc:
        raise EndpointError(
            f"Iceberg catalog {pipeline.catalog.uri}: cannot load "
            f"{pipeline.namespace}.{table.target}: {exc}"
        ) from exc
    snap = ice.current_snapshot()
    committed = _offsets_snapshot(ice)
    return TableState(
        True,
        committed_from_snapshots(_ancestry(ice)),
        _summary(snap),
        snap.timestamp_ms if snap else None,
        _summary(committed),
        committed.timestamp_ms if committed else None,
    )
