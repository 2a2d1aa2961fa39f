"""The Iceberg catalog from outside Spark (pyiceberg): committed offsets, table state."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote as urlquote
from urllib.parse import urlencode, urlsplit

from cdclake.config import CatalogConfig, CatalogType, PipelineConfig, TableConfig
from cdclake.exceptions import ConfigError, EndpointError
from cdclake.iceberg.maintenance import PROPERTY_LAST_RUN
from cdclake.iceberg.snapshots import committed_from_snapshots, expired_ancestor_error
from cdclake.iceberg.tags import CONSISTENT_TAG, cut_of
from cdclake.kafka.topics import discover
from cdclake.offsets import SUMMARY_OFFSETS, Cut, TopicPartition

from cdclake_control.source import libpq_settings

if TYPE_CHECKING:
    import requests
    from pyiceberg.catalog import Catalog
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot


def sqlalchemy_uri(catalog: CatalogConfig) -> str:
    """jdbc:postgresql://host:port/db -> postgresql+psycopg://user:password@host:port/db,
    with the pipeline's timeouts as libpq settings (pyiceberg's SqlCatalog takes no
    connect_args; SQLAlchemy hands the URL's query to psycopg.connect)."""
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
    # the JDBC URI's own parameters are JDBC's, not libpq's: not passed on
    query = urlencode(libpq_settings(catalog.timeouts), quote_via=urlquote)
    return f"postgresql+psycopg://{netloc}{parts.path}?{query}"


def catalog_endpoint(catalog: CatalogConfig) -> str:
    """host:port of the catalog's URI (what a message about it names first)."""
    uri = catalog.uri.removeprefix("jdbc:")
    parts = urlsplit(uri)
    if not parts.hostname:
        return catalog.uri
    default = {"http": 80, "https": 443, "postgresql": 5432}.get(parts.scheme, "")
    return f"{parts.hostname}:{parts.port or default}"


def _rest_catalog(catalog: CatalogConfig, props: dict[str, str]) -> RestCatalog:
    """pyiceberg's REST catalog with every request bounded (it sets no timeout of its own
    and has no property for one): `timeouts.connect_s` to connect, `request_s` to answer."""
    from pyiceberg.catalog.rest import RestCatalog

    bounds = (catalog.timeouts.connect_s, catalog.timeouts.request_s)

    class BoundedRestCatalog(RestCatalog):
        def _create_session(self) -> requests.Session:
            session = super()._create_session()
            send = session.request

            def request(method: str, url: str | bytes, **kwargs: Any) -> requests.Response:
                if kwargs.get("timeout") is None:
                    kwargs["timeout"] = bounds
                return send(method, url, **kwargs)

            # a wrapper with a default timeout; Session's get/post/... pass all but the
            # method and URL by keyword, which is all it takes
            session.request = request  # type: ignore[method-assign, assignment]
            return session

    return BoundedRestCatalog(catalog.name, uri=catalog.uri, warehouse=catalog.warehouse, **props)


def load_catalog(catalog: CatalogConfig) -> Catalog:
    """The pipeline's catalog; one that cannot be reached within the pipeline's timeouts
    is an EndpointError naming its host and port and what to check."""
    props = {k: v for k, v in catalog.properties.items() if not k.startswith("jdbc.")}
    try:
        if catalog.type == CatalogType.JDBC:
            from pyiceberg.catalog.sql import SqlCatalog

            def connect() -> Catalog:
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
        return _rest_catalog(catalog, props)
    except ConfigError:
        raise
    except Exception as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        jdbc = catalog.type == CatalogType.JDBC
        what = "its database runs there" if jdbc else "the REST service runs there"
        raise EndpointError(
            f"Iceberg catalog at {catalog_endpoint(catalog)} ({catalog.uri}) could not be "
            f"reached (timeouts: connect {catalog.timeouts.connect_s:g}s, request "
            f"{catalog.timeouts.request_s:g}s): {reason} -- check that {what} and answers "
            "this host, and catalog.uri and catalog.properties in the pipeline file"
        ) from exc


def _ancestry_snapshots(table: Table, name: str = "") -> Iterator[Snapshot]:
    snap = table.current_snapshot()
    while snap is not None:
        yield snap
        parent_id = snap.parent_snapshot_id
        if parent_id is None:
            return
        parent = table.snapshot_by_id(parent_id)
        if parent is None:
            raise expired_ancestor_error(name, snap.snapshot_id, parent_id)
        snap = parent


def _summary(snap: Snapshot | None) -> dict[str, str]:
    return dict(snap.summary.additional_properties) if snap is not None and snap.summary else {}


def _ancestry(table: Table, name: str = "") -> Iterable[dict[str, str]]:
    return (_summary(s) for s in _ancestry_snapshots(table, name))


def _offsets_snapshot(table: Table, name: str = "") -> Snapshot | None:
    """The newest snapshot (walking back from current) that carries committed offsets."""
    ancestors = _ancestry_snapshots(table, name)
    return next((s for s in ancestors if SUMMARY_OFFSETS in _summary(s)), None)


@dataclass(frozen=True)
class TableState:
    exists: bool
    offsets: dict[TopicPartition, int]
    summary: dict[str, str]
    committed_at_ms: int | None
    # The snapshot that committed `offsets` (the current one unless maintenance came after)
    offsets_summary: dict[str, str] = field(default_factory=dict)
    offsets_committed_at_ms: int | None = None
    # the source transaction its `CONSISTENT_TAG` stands at (`consistency: transaction`)
    consistent: Cut | None = None


def table_state(cat: Catalog, pipeline: PipelineConfig, table: TableConfig) -> TableState:
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
    name = f"{pipeline.namespace}.{table.target}"
    committed = _offsets_snapshot(ice, name)
    return TableState(
        True,
        committed_from_snapshots(_ancestry(ice, name)),
        _summary(snap),
        snap.timestamp_ms if snap else None,
        _summary(committed),
        committed.timestamp_ms if committed else None,
        _consistent_cut(ice),
    )


def _consistent_cut(table: Table) -> Cut | None:
    """The cut whose tag stands where the table's `CONSISTENT_TAG` does."""
    refs = table.metadata.refs
    moving = refs.get(CONSISTENT_TAG)
    if moving is None:
        return None
    cuts = [cut_of(name) for name, ref in refs.items() if ref.snapshot_id == moving.snapshot_id]
    found = [c for c in cuts if c is not None]
    return max(found, key=lambda c: (c.ts_ms, c.lsn or 0)) if found else None


def last_runs(pipeline: PipelineConfig) -> list[dict[str, Any] | None]:
    """Per table, the figures its last maintenance run stored (None: never maintained)."""
    from pyiceberg.exceptions import NoSuchTableError

    cat = load_catalog(pipeline.catalog)
    pipeline = discover(pipeline)
    out: list[dict[str, Any] | None] = []
    for table in pipeline.tables:
        try:
            ice = cat.load_table((pipeline.namespace, table.target))
        except NoSuchTableError:
            out.append(None)
            continue
        text = ice.properties.get(PROPERTY_LAST_RUN)
        out.append(json.loads(text) if text else None)
    return out
