"""The one place that knows how to configure Spark for cdclake (jars, catalog, session)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdclake.config import CatalogConfig, CatalogType, PipelineConfig
from cdclake.exceptions import ConfigError, EndpointError
from cdclake.jvm import DRIVER_OPTIONS, driver_java_options, resolves_by_range

if TYPE_CHECKING:
    from pyspark import StorageLevel
    from pyspark.sql import SparkSession

# The jars a load adds to Spark, found by artifact in the folder CDCLAKE_SPARK_JARS names:
# stack/spark/pom.xml pins their versions, and `cdclake local up` resolves it from Maven
# Central (`cdclake local env` exports the folder). A pipeline whose `spark.conf` sets
# spark.jars or spark.jars.packages gets exactly those instead.
SPARK_JARS_ENV = "CDCLAKE_SPARK_JARS"
USER_JAR_SETTINGS = ("spark.jars", "spark.jars.packages")
S3_SCHEMES = ("s3://", "s3a://", "s3n://")
# The executors' Python and the driver's. spark-submit takes them from these settings
# before the environment (through Kubernetes, SparkSubmitOperator's env_vars only reach a
# cluster-mode driver); a cluster whose executors keep Python elsewhere sets its own.
PYTHON = "spark.pyspark.python"
DRIVER_PYTHON = "spark.pyspark.driver.python"


class SparkJar(Enum):
    """A jar a load may need, by Maven artifact (group org.apache.iceberg or org.postgresql)."""

    ICEBERG_RUNTIME = "iceberg-spark-runtime-3.5_2.12"
    ICEBERG_AWS = "iceberg-aws-bundle"  # S3FileIO: a catalog or warehouse on S3
    POSTGRES_JDBC = "postgresql"  # the JDBC catalog


def spark_jars(pipeline: PipelineConfig) -> list[Path]:
    """The `SparkJar`s the pipeline's catalog needs, from the folder CDCLAKE_SPARK_JARS
    names; a missing folder or jar is a ConfigError saying what to run or set."""
    catalog = pipeline.catalog
    needed = [SparkJar.ICEBERG_RUNTIME]
    io_impl = catalog.properties.get("io-impl", "")  # files on S3: S3FileIO and the AWS SDK
    if catalog.warehouse.startswith(S3_SCHEMES) or io_impl.endswith("S3FileIO"):
        needed.append(SparkJar.ICEBERG_AWS)
    if catalog.type == CatalogType.JDBC:
        needed.append(SparkJar.POSTGRES_JDBC)
    how = (
        f"run `python -m cdclake local up` (it resolves stack/spark/pom.xml from Maven Central) "
        f'and `eval "$(python -m cdclake local env)"`, or set spark.conf.spark.jars or '
        f"spark.conf.spark.jars.packages in {pipeline.path}"
    )
    folder = os.environ.get(SPARK_JARS_ENV, "").strip()
    if not folder:
        raise ConfigError(
            f"{pipeline.path}: the Iceberg Spark runtime jar is not configured: {SPARK_JARS_ENV} "
            f"names no folder of jars -- {how}"
        )
    found = []
    for jar in needed:
        matches = sorted(Path(folder).glob(f"{jar.value}-[0-9]*.jar"))
        if len(matches) != 1:
            what = "no" if not matches else f"{len(matches)} versions of"
            raise ConfigError(
                f"{pipeline.path}: {what} {jar.value} jar in {folder} ({SPARK_JARS_ENV}); "
                f"a {catalog.type} catalog needs one -- {how}"
            )
        found.append(matches[0])
    return found


# The settings spark-submit's command line carries (Airflow logs it, `ps` shows it): those
# spark-submit itself or the driver's JVM reads before the driver's Python runs. The
# driver sets every other one (the catalog's, the pipeline's own `spark.conf`) from the
# pipeline file and its environment when it builds its session (`build_session`).
LAUNCH_SETTINGS = frozenset(
    {
        PYTHON,
        DRIVER_PYTHON,
        DRIVER_OPTIONS,
        "spark.driver.memory",
        "spark.driver.cores",
        "spark.driver.extraClassPath",
        "spark.driver.extraLibraryPath",
        *USER_JAR_SETTINGS,
        "spark.jars.repositories",
        "spark.jars.excludes",
        "spark.jars.ivy",
        "spark.submit.pyFiles",
        "spark.archives",
        "spark.files",
        "spark.submit.deployMode",
        "spark.kubernetes.container.image",
        "spark.kubernetes.namespace",
        "spark.yarn.queue",
    }
)
# Settings a session takes after it started (`build_session`), kept off the command line
# of a JVM this process starts: a catalog's, whatever their names (a password, a REST
# catalog's `header.Authorization`, an object store's keys)
RUNTIME_PREFIX = "spark.sql.catalog."


def catalog_spark_conf(catalog: CatalogConfig) -> dict[str, str]:
    prefix = f"spark.sql.catalog.{catalog.name}"
    conf = {
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.type": str(catalog.type),
        f"{prefix}.uri": catalog.uri,
        f"{prefix}.warehouse": catalog.warehouse,
        **_catalog_timeouts(prefix, catalog),
    }
    for key, value in catalog.properties.items():
        conf[f"{prefix}.{key}"] = value
    return conf


def _catalog_timeouts(prefix: str, catalog: CatalogConfig) -> dict[str, str]:
    """The pipeline's timeouts for Iceberg's own catalog clients (the JDBC driver's
    properties in seconds; pgjdbc waits for a login forever by default)."""
    connect, request = catalog.timeouts.connect_s, catalog.timeouts.request_s
    if catalog.type == CatalogType.JDBC:
        return {
            f"{prefix}.jdbc.connectTimeout": str(max(1, round(connect))),
            f"{prefix}.jdbc.loginTimeout": str(max(1, round(connect))),
            f"{prefix}.jdbc.socketTimeout": str(max(1, round(request))),
        }
    return {
        f"{prefix}.rest.client.connection-timeout-ms": str(int(connect * 1000)),
        f"{prefix}.rest.client.socket-timeout-ms": str(int(request * 1000)),
    }


def launch_conf(pipeline: PipelineConfig) -> dict[str, str]:
    """What goes on spark-submit's command line: the pipeline's `spark_conf` of
    `LAUNCH_SETTINGS` only."""
    return {k: v for k, v in spark_conf(pipeline).items() if k in LAUNCH_SETTINGS}


# The settings of the driver itself (its JVM, its SparkContext, its SQL extensions): a
# spark-submit'd load sets them at its start, a Spark Connect server at its own
# (`cdclake local up`; docs/operations.md for a server of your own).
DRIVER_CONF = {
    "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # a task's log shows the job's answer, not Spark's INFO lines (from the
    # SparkContext's start on); a pipeline that wants them sets it in `spark.conf`
    "spark.log.level": "WARN",
    "spark.driver.memory": "4g",
    # cached batches that spill to disk are read back whole: Kryo keeps them compact
    "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
}


def session_conf(pipeline: PipelineConfig) -> dict[str, str]:
    """The settings a load's session takes once it runs, on either engine: the catalog's,
    the SQL engine's, and the pipeline's own `spark.conf` of `spark.sql.*`."""
    conf = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.adaptive.enabled": "true",
        # rows of decoded changes are wide (every column, before and after): cache them in
        # batches of 2,000 rather than 10,000 so building one stays small
        "spark.sql.inMemoryColumnarStorage.batchSize": "2000",
        # and keep their values as they are: Spark's encoders (dictionary, run length)
        # find little in mostly unique text, and trying them on every column costs the
        # executors more than the ~15% memory it saves while a batch runs
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        **catalog_spark_conf(pipeline.catalog),
    }
    own = {k: v for k, v in pipeline.spark.conf.items() if k.startswith("spark.sql.")}
    return {**conf, **{k: v for k, v in own.items() if k not in DRIVER_CONF}}


def spark_conf(
    pipeline: PipelineConfig,
    records: int | None = None,
    ranged: bool | None = None,
) -> dict[str, str]:
    """Every Spark setting a spark-submit'd load needs; the pipeline's own `spark.conf`
    wins. The driver's Java options depend on the batch's size (`records`; None when
    unknown) and whether it resolves range by range (`ranged`; None: as
    `resolves_by_range` says of the pipeline alone)."""
    conf = {
        **DRIVER_CONF,
        PYTHON: sys.executable,
        DRIVER_PYTHON: sys.executable,
        **session_conf(pipeline),
    }
    if not any(key in pipeline.spark.conf for key in USER_JAR_SETTINGS):
        conf["spark.jars"] = ",".join(str(j) for j in spark_jars(pipeline))
    if ranged is None:
        ranged = resolves_by_range(pipeline)
    options = driver_java_options(records, ranged)
    if options:
        conf[DRIVER_OPTIONS] = options
    conf.update(pipeline.spark.conf)
    return conf


# The Spark Connect server a load runs on instead of a driver of its own:
# sc://host:port/;x-cdclake-token=<token> (docs/operations.md, "Spark Connect")
REMOTE_ENV = "CDCLAKE_SPARK_REMOTE"
# backoffs of 0.05, 0.2, 0.8, 3.2 and 5 s: about 10 s of retries a call
CONNECT_RETRIES = {"max_retries": 5, "max_backoff": 5_000}
TOKEN_HEADER = "x-cdclake-token"  # sent with every call (`stack/spark-connect/ConnectGuard.java`)


def remote_url(host: str, port: int | str, token: str) -> str:
    """The `REMOTE_ENV` URL of a server at `host`:`port` whose guard takes `token`."""
    return f"sc://{host}:{port}/;{TOKEN_HEADER}={token}"


def connect_session(pipeline: PipelineConfig, remote: str, key: str) -> SparkSession:
    """The session named `key` on the Spark Connect server at `remote` (`REMOTE_ENV`'s
    form), with the load's `session_conf`; the server holds the driver's settings.

    Loads that never run at once share a key, so their session: an Airflow task's
    (`max_active_runs=1`), the CLI's of a pipeline. A Spark Connect 3.5 server cannot
    end a session before an hour idle, and each session keeps its catalog's connections:
    a session per batch would hold ~60 catalog connections a pipeline at one batch a
    minute."""
    import uuid

    from pyspark.sql import SparkSession

    _check_reachable(remote, pipeline.timeouts.connect_s)
    session = uuid.uuid5(uuid.NAMESPACE_URL, f"cdclake:{key}")
    spark = SparkSession.builder.remote(f"{remote};session_id={session}").create()
    # the client retries a call the server did not answer for at least 10 minutes by
    # default; a batch whose server went away fails within seconds instead
    spark.client._retry_policy.update(CONNECT_RETRIES)
    for key_, value in session_conf(pipeline).items():
        spark.conf.set(key_, value)
    return spark


def _check_reachable(remote: str, timeout_s: float) -> None:
    """An EndpointError naming the server when nothing answers at `remote`'s host and
    port within `timeout_s` (the client's first call would retry for minutes)."""
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(remote.split(";", 1)[0].replace("sc://", "http://", 1))
    host, port = where.hostname or "", where.port or 15002
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise EndpointError(
            f"Spark Connect server at {host}:{port} could not be reached within "
            f"{timeout_s:g}s ({exc}) -- check that it runs and that {REMOTE_ENV} or "
            "spark.connect_conn_id names it"
        ) from None


def load_session(
    pipeline: PipelineConfig,
    master: str | None = None,
    records: int | None = None,
    ranged: bool | None = None,
) -> SparkSession:
    """The session a load of the CLI runs in: the pipeline's on the Spark Connect server
    `REMOTE_ENV` names, else a driver of its own (`build_session`)."""
    remote = os.environ.get(REMOTE_ENV, "").strip()
    if remote:
        return connect_session(pipeline, remote, f"cli/{pipeline.name}")
    return build_session(pipeline, master, records=records, ranged=ranged)


def is_connect(spark: Any) -> bool:
    """Whether `spark` is a Spark Connect session (a client of a long-lived server) rather
    than a classic one with its driver in this process."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def build_session(
    pipeline: PipelineConfig,
    master: str | None = None,
    records: int | None = None,
    ranged: bool | None = None,
) -> SparkSession:
    """A SparkSession for a load (spark-submit passes its own master and conf); a new
    driver JVM gets the Java options for a batch of `records` records (`spark_conf`)."""
    # PySpark started in this process takes the executors' Python from the environment
    # alone: set it from the pipeline's setting, as spark-submit does
    if PYTHON in pipeline.spark.conf:
        os.environ["PYSPARK_PYTHON"] = pipeline.spark.conf[PYTHON]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"cdclake-{pipeline.name}")
    if master:
        builder = builder.master(master)
    conf = spark_conf(pipeline, records=records, ranged=ranged)
    # a JVM this process starts gets the builder's settings on its command line, which
    # `ps` shows: the catalog's are set on the session after it started, before anything
    # loads the catalog
    later = {k: v for k, v in conf.items() if k.startswith(RUNTIME_PREFIX)}
    for key, value in conf.items():
        if key not in later:
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for key, value in later.items():
        spark.conf.set(key, value)
    # Iceberg logs an ERROR with its stack for each metadata file its removal of
    # orphan files finds already deleted (`write.metadata.delete-after-commit`), and goes on
    jvm: Any = spark._jvm
    log4j = jvm.org.apache.logging.log4j
    log4j.core.config.Configurator.setLevel("org.apache.iceberg.ReachableFileUtil", log4j.Level.OFF)
    from py4j.java_gateway import java_import

    for name in JVM_NAMES:
        java_import(spark._jvm, name)
    return spark


# The JVM classes PySpark reaches by short name for every column expression it builds
# (`F.col` goes through `_jvm.functions`, `_to_seq` through `_jvm.PythonUtils`).
# py4j resolves a short name by trying each package PySpark imports with a wildcard, in
# order, and each miss searches every jar of the classpath: about 0.7 ms of a call to
# `F.col`. Imported by full name they resolve at the first try; a table's decode and
# resolve build a few hundred such expressions.
JVM_NAMES = (
    "org.apache.spark.sql.functions",
    "org.apache.spark.api.python.PythonUtils",
    "org.apache.spark.sql.api.python.PythonSQLUtils",
    "org.apache.spark.api.python.SerDeUtil",
)


# A batch of at most `Tuning.driver_read_records` records (the size the driver reads)
# evaluates its expressions interpreted (`SMALL_BATCH_CONF`), wherever it is read: each
# table's MERGE or append compiles to Java classes per query, which costs more than
# evaluating them for the rows of such a batch (docs/performance.md, "Small batches").
#
# The raw rows the driver read are one partition (`SMALL_BATCH_PARTITIONS`): each task
# carries the whole plan, and deserialising it for each of a dozen near-empty tasks cost
# more than the rows. Shuffles keep their partitions and adaptive execution: a small
# batch's MERGE into a 10M-row table took 16.2 s with one shuffle partition and no
# adaptive execution, 10.1 s with them.
SMALL_BATCH_CONF = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
SMALL_BATCH_PARTITIONS = 1
# A batch that evaluates its expressions interpreted compiles them from the moment one of
# its tables is a MERGE target of more rows than this (`Batch.compile_for`): the MERGE
# scans the key and LSN of every row of the target, whatever the batch's size.
# 10,000 changes, warm session, medians interpreted / compiled: into 100k rows 2.13 / 2.11 s,
# 1M rows 2.36 / 2.15 s, 3M rows 2.77 / 2.25 s; into 10M rows 4.9 / 3.8 s.
COMPILE_TARGET_ROWS = 1_000_000


# A batch of more records than this caches its raw records and decoded changes on disk
# only. In memory, a cached block is built whole before it can spill: with a 4g driver a
# 10M-record batch ran out of heap that way after ~4.5M records. On disk, memory stays
# that of a block at a time whatever the batch's size (a 10M-record batch peaked at
# 3.5 GiB of RSS where a 1M-record one cached in memory took 5.4 GiB), and the load was
# no slower: 5% faster at 1M records, the same at 100k, side by side.
LARGE_BATCH_RECORDS = 100_000


def cache_level(records: int) -> StorageLevel:
    """The storage level of what a batch (or a table of it) of `records` records caches."""
    from pyspark import StorageLevel

    if records > LARGE_BATCH_RECORDS:
        return StorageLevel.DISK_ONLY
    return StorageLevel.MEMORY_AND_DISK


@contextmanager
def batch_settings(
    spark: SparkSession, conf: Mapping[str, str]
) -> Iterator[Mapping[str, str | None]]:
    """Set `conf` on the session for one batch and put the old values back afterwards;
    yields the old values (None: unset). Session settings are shared by every thread:
    set them before the tables' threads start, never inside one (but for the one-way
    switch of `Batch.compile_for`, which changes how fast, not what, a query computes)."""
    old = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield old
    finally:
        restore_settings(spark, old)


def restore_settings(spark: SparkSession, old: Mapping[str, str | None]) -> None:
    """Put back session settings as `batch_settings` found them (None: unset)."""
    for k, v in old.items():
        if v is None:
            spark.conf.unset(k)
        else:
            spark.conf.set(k, v)
