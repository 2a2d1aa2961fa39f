"""The Iceberg catalog through pyiceberg: what a load reads of its tables' metadata
(snapshots, refs, properties, schema, partition spec), whichever engine writes them.

A load's Spark session, classic or Spark Connect, names its catalogs in its settings
(`spark.sql.catalog.<name>.*`, `cdclake.spark.catalog_spark_conf`); `lake_table` reads
them from the session once and loads a table's metadata from the same catalog, without
the JVM. Writes stay Spark's: SQL, the DataFrame API and Iceberg's procedures."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote as urlquote
from urllib.parse import urlencode, urlsplit

from cdclake.config import CatalogConfig, CatalogType, TimeoutsConfig, libpq_settings
from cdclake.exceptions import ConfigError, EndpointError
from cdclake.iceberg.snapshots import expired_ancestor_error

if TYPE_CHECKING:
    import requests
    from pyiceberg.catalog import Catalog
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot
    from pyspark.sql import SparkSession

_PREFIX = "spark.sql.catalog."
# Spark's names of the catalog's own settings, which CatalogConfig keeps apart
_OWN = ("type", "uri", "warehouse")
_JDBC_TIMEOUTS = ("jdbc.connectTimeout", "jdbc.loginTimeout", "jdbc.socketTimeout")
_REST_TIMEOUTS = ("rest.client.connection-timeout-ms", "rest.client.socket-timeout-ms")


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


def session_catalog(spark: SparkSession, name: str) -> CatalogConfig:
    """The catalog `name` as the session's settings configure it (`SET`: a classic
    session and a Spark Connect one)."""
    return catalog_of_settings([(row[0], row[1]) for row in spark.sql("SET").collect()], name)


def catalog_of_settings(conf: list[tuple[str, str]], name: str) -> CatalogConfig:
    """The catalog `name` as Spark settings (`catalog_spark_conf`'s) configure it; a
    ConfigError when they hold none of that name."""
    prefix = f"{_PREFIX}{name}."
    settings = {k[len(prefix) :]: v for k, v in conf if k.startswith(prefix)}
    if not all(k in settings for k in _OWN):
        raise ConfigError(
            f"the Spark session has no Iceberg catalog {name!r} (spark.sql.catalog.{name}.type, "
            ".uri and .warehouse): set the pipeline's catalog"
        )
    if settings["type"] == CatalogType.JDBC:
        connect, request = float(settings[_JDBC_TIMEOUTS[0]]), float(settings[_JDBC_TIMEOUTS[2]])
    else:
        connect = int(settings.get(_REST_TIMEOUTS[0], "10000")) / 1000
        request = int(settings.get(_REST_TIMEOUTS[1], "60000")) / 1000
    return CatalogConfig(
        name=name,
        type=CatalogType(settings["type"]),
        uri=settings["uri"],
        warehouse=settings["warehouse"],
        properties={
            k: v for k, v in settings.items() if k not in (*_OWN, *_JDBC_TIMEOUTS, *_REST_TIMEOUTS)
        },
        timeouts=TimeoutsConfig(connect_s=connect, request_s=request),
    )


_CATALOGS = threading.Lock()


def _session_catalog(spark: SparkSession, name: str) -> Catalog | _HadoopTables:
    """The session's catalog `name`, made once per session (a batch's table threads
    share it)."""
    with _CATALOGS:
        return _made_catalog(spark, name)


@functools.lru_cache(maxsize=8)
def _made_catalog(spark: SparkSession, name: str) -> Catalog | _HadoopTables:
    warehouse = spark.conf.get(f"{_PREFIX}{name}.warehouse", None)
    if spark.conf.get(f"{_PREFIX}{name}.type", None) == "hadoop" and warehouse:
        return _HadoopTables(warehouse)
    return load_catalog(session_catalog(spark, name))


class _HadoopTables:
    """The tables of a Hadoop catalog (files only, which pyiceberg has no catalog for: each
    table's `version-hint.text` names its metadata), as the JVM archive's warm-up keeps
    them (`cdclake_bench.jvm_archive`); pipelines name a JDBC or REST catalog."""

    def __init__(self, warehouse: str) -> None:
        self.warehouse = warehouse.rstrip("/")

    def load_table(self, identifier: str) -> Table:
        from pyiceberg.exceptions import NoSuchTableError
        from pyiceberg.io import load_file_io
        from pyiceberg.table import StaticTable

        base = f"{self.warehouse}/{identifier.replace('.', '/')}/metadata"
        hint = load_file_io(location=base).new_input(f"{base}/version-hint.text")
        if not hint.exists():
            raise NoSuchTableError(identifier)
        with hint.open() as f:
            version = f.read().decode().strip()
        return StaticTable.from_metadata(f"{base}/v{version}.metadata.json")


def lake_table(spark: SparkSession, qualified: str) -> Table | None:
    """The metadata of table `qualified` (catalog.namespace.table) as it is now; None when
    the table does not exist."""
    from pyiceberg.exceptions import NoSuchTableError

    name, _, identifier = qualified.partition(".")
    try:
        return _session_catalog(spark, name).load_table(identifier)
    except NoSuchTableError:
        return None


def ancestry(table: Table, name: str = "") -> Iterator[Snapshot]:
    """The table's current snapshot and its ancestors, newest first; a parent expired on
    the way is `expired_ancestor_error`."""
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


def summary_of(snap: Snapshot | None) -> dict[str, str]:
    """A snapshot's summary properties ({} for none)."""
    return dict(snap.summary.additional_properties) if snap is not None and snap.summary else {}


def summaries(table: Table, name: str = "") -> Iterator[dict[str, str]]:
    """The summaries of `ancestry`."""
    return (summary_of(s) for s in ancestry(table, name))
