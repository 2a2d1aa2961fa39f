"""The Spark driver JVM's options: a class-data-sharing archive, and the JIT for the
batch's size.

A load's JVM starts cold: it loads, parses and verifies thousands of Spark classes, and
compiles the hot ones twice (C1, then C2), before the first table is done. A dynamic
class-data-sharing archive holds Spark's classes ready to map, and the client compiler
alone (`-XX:TieredStopAtLevel=1`) spares a batch of up to `QUICK_JIT_RECORDS` records
(`RANGED_QUICK_JIT_RECORDS` when it resolves range by range) C2's compiles, which pay only
for bigger ones (the measurements: docs/performance.md, "The driver JVM").

The archive is built by `cdclake jvm-archive` (cdclake_bench.jvm_archive). `driver_java_options`
gives a driver the archive when it exists and the JIT for its batch. The JVM checks the
archive against its own build and class path and runs without it when they differ (a
warning on stderr), so a stale archive costs the time it would have saved, nothing else.

`CDCLAKE_JVM_ARCHIVE` sets the archive's path, or `off` to never use one; by default it
lives in the user's cache directory, named after the Spark version, install (its jars'
names, sizes and times: a reinstall makes a new archive, as the JVM would refuse the old
one) and Java. A pipeline that sets `spark.driver.extraJavaOptions` in its `spark.conf`
gets exactly that.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cdclake.config import PipelineConfig
    from cdclake.offsets import OffsetRange

ARCHIVE_ENV = "CDCLAKE_JVM_ARCHIVE"
DRIVER_OPTIONS = "spark.driver.extraJavaOptions"
# A batch of at most this many records runs its driver with the client compiler only,
# and of at most `RANGED_QUICK_JIT_RECORDS` when it resolves range by range
QUICK_JIT_RECORDS = 250_000
RANGED_QUICK_JIT_RECORDS = 2_000_000
# the job writes its results to stdout: the JVM's own warnings (an archive that does not
# match) must go to stderr
_LOG_TO_STDERR = "-Xlog:disable -Xlog:all=warning:stderr"

log = logging.getLogger(__name__)


def driver_java_options(records: int | None = None, ranged: bool = False) -> str:
    """The driver's Java options for a batch of `records` records (None: unknown, e.g.
    a backfill of many batches): the archive when it exists, and the client compiler
    alone for a small batch, or for one of up to `RANGED_QUICK_JIT_RECORDS` that is
    `ranged` (`resolves_by_range`). Empty when neither applies."""
    parts = []
    archive = archive_path()
    if archive is not None and archive.is_file():
        parts.append(f"-XX:SharedArchiveFile={archive} -Xshare:auto")
    limit = RANGED_QUICK_JIT_RECORDS if ranged else QUICK_JIT_RECORDS
    if records is not None and records <= limit:
        parts.append("-XX:TieredStopAtLevel=1")
    if parts:
        parts.append(_LOG_TO_STDERR)
    return " ".join(parts)


def resolves_by_range(
    pipeline: PipelineConfig, ranges: Iterable[OffsetRange] | None = None
) -> bool:
    """A big batch of the pipeline's is resolved range by range, unless a topic's ranges
    hold what they cannot take: no table with a configured `key` has its topic in more
    than one partition of the batch's `ranges` (a table without a primary key sends no
    Kafka key, so its keys spread over the partitions and one task groups them).
    Without `ranges`, no table may have a configured key."""
    keyed = {pipeline.topic_for(t) for t in pipeline.tables if t.key}
    if not keyed:
        return True
    if ranges is None:
        return False
    partitions: dict[str, set[int]] = {}
    for r in ranges:
        if r.topic in keyed:
            partitions.setdefault(r.topic, set()).add(r.partition)
    return all(len(p) <= 1 for p in partitions.values())


def archive_path() -> Path | None:
    """Where this environment's archive is (or would be); None when switched off."""
    value = os.environ.get(ARCHIVE_ENV, "").strip()
    if value.lower() == "off":
        return None
    if value:
        return Path(value).expanduser()
    jars = spark_jars()
    if jars is None:
        return None
    version = importlib.metadata.version("pyspark")
    identity = f"{_class_path(jars)}|{version}|{_java()}"
    key = hashlib.blake2b(identity.encode(), digest_size=6).hexdigest()
    return cache_home() / f"spark-driver-{version}-{key}.jsa"


def cache_home() -> Path:
    """The user's cache directory for cdclake (`$XDG_CACHE_HOME/cdclake`, by default
    `~/.cache/cdclake`): the archive, and the local stack's downloaded and built parts."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cdclake"


def spark_jars() -> Path | None:
    """The installed Spark's jars folder; None without pyspark."""
    # found without importing pyspark: DAG files call this when Airflow parses them
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "jars"


def _class_path(folder: Path) -> str:
    """The Spark install's class path as the JVM checks it against an archive: each jar's
    path, size and modification time."""
    found = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    return ";".join(f"{j}:{(s := j.stat()).st_size}:{s.st_mtime_ns}" for j in found)


def _java() -> str:
    """Which Java spark-submit starts (its path; the JVM checks the exact build itself)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return str(Path(home).resolve())
    found = shutil.which("java")
    return str(Path(found).resolve()) if found else ""
