"""Building the Spark driver's class-data-sharing archive (`cdclake jvm-archive`), once
per environment, off the batch path.

The archive is built for this environment's Spark and Java by a warm-up load of generated
events into a scratch Hadoop-catalog warehouse, in a spark-submit of its own whose JVM
writes the archive at its exit. Where it lives and how a driver uses it:
cdclake.jvm.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cdclake.exceptions import CdclakeError
from cdclake.jvm import ARCHIVE_ENV, DRIVER_OPTIONS, archive_path, spark_jars
from cdclake.spark import launch_conf

# writing the archive warns for every class it leaves out (signed jars, old class files)
_QUIET = "-Xlog:disable -Xlog:all=error:stderr"
WARM_UP_EVENTS = 400

log = logging.getLogger(__name__)


def build_archive(archive: Path | None = None, *, force: bool = False) -> Path:
    """Write the archive (unless it exists and `force` is not set) and return its path.
    The warm-up's JVM writes it at exit to a temporary file, renamed into place once
    complete, so a driver starting meanwhile never maps half an archive; a process that
    asks while another builds it waits for that build (a lock beside the archive)."""
    archive = archive or archive_path()
    if archive is None:
        raise CdclakeError(f"{ARCHIVE_ENV}=off: no archive to build")
    if archive.is_file() and not force:
        log.info("%s exists", archive)
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    with open(archive.with_name(f".{archive.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.is_file() and not force:
            return archive  # built by the process that held the lock
        _build(archive)
    return archive


def _build(archive: Path) -> None:
    partial = archive.with_name(f".{archive.name}.{os.getpid()}.partial")
    spark_submit = Path(sys.executable).parent / "spark-submit"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cdclake-warm-up-") as scratch:
        conf = {**launch_conf(_warm_up_pipeline(Path(scratch))),
                DRIVER_OPTIONS: f"-XX:ArchiveClassesAtExit={partial} {_QUIET}"}  # fmt: skip
        cmd = [str(spark_submit), "--master", "local[2]"]
        for k, v in conf.items():
            cmd += ["--conf", f"{k}={v}"]
        cmd += [__file__, scratch]
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, ARCHIVE_ENV: "off"}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise CdclakeError(
            f"the warm-up for the JVM archive failed (exit {done.returncode}): "
            f"{done.stderr[-2000:]}"
        )
    os.replace(partial, archive)
    drop_replaced(archive, spark_jars())
    log.info("wrote %s (%.0f MB) in %.0f s", archive, archive.stat().st_size / 1e6,
             time.perf_counter() - started)  # fmt: skip


def drop_replaced(archive: Path, spark_jars: Path) -> None:
    """Note that `archive` was built for the Spark install of `spark_jars`, and delete the
    archives it replaces: those built for the same install before a reinstall, or for an
    install that no longer exists (170 MB each)."""
    jars = str(spark_jars)
    _origin(archive).write_text(jars)
    for other in archive.parent.glob("spark-driver-*.jsa"):
        origin = _origin(other)
        built_for = origin.read_text() if origin.is_file() else None
        if other != archive and (built_for == jars or (built_for and not Path(built_for).is_dir())):
            log.info("deleting %s, replaced by %s", other, archive.name)
            other.unlink(missing_ok=True)
            origin.unlink(missing_ok=True)


def _origin(archive: Path) -> Path:
    return archive.with_name(f"{archive.name}.from")


def _workload():
    from cdclake_bench.events import Workload

    return Workload.standard(WARM_UP_EVENTS, WARM_UP_EVENTS // 4, "warmup", tables=2)


def _warm_up_pipeline(scratch: Path):
    """The warm-up's pipeline: its tables in a Hadoop catalog in `scratch`."""
    from cdclake.config import CatalogConfig, KafkaConfig, PipelineConfig, TableConfig

    return PipelineConfig(
        name="warmup", path=scratch / "warmup.yaml", topic_prefix="warmup",
        kafka=KafkaConfig(bootstrap_servers="unused:9092"),  # the events are generated
        catalog=CatalogConfig("lake", "hadoop", "", (scratch / "warehouse").as_uri()),
        namespace="warmup",
        tables=tuple(TableConfig(s.topic.split(".", 1)[1], s.topic.rsplit(".", 1)[1])
                     for s in _workload().streams),
    )  # fmt: skip


def _warm_up(scratch: Path) -> None:
    """A load's work in this JVM: create tables from generated events, then MERGE a
    second batch into them (deletes, tombstones, the deleted-keys ledger)."""
    from cdclake.job import run_batch
    from cdclake.offsets import BatchPlan, OffsetRange
    from cdclake.spark import build_session

    from cdclake_bench.sources import generated_reader

    workload = _workload()
    pipeline = _warm_up_pipeline(scratch)
    spark = build_session(pipeline)
    half = {(t, p): n // 2 for t, p, n in workload.slices()}
    for name, bounds in (("create", lambda t, p, n: (0, half[(t, p)])),
                         ("merge", lambda t, p, n: (half[(t, p)], n))):  # fmt: skip
        ranges = tuple(OffsetRange(t, p, *bounds(t, p, n)) for t, p, n in workload.slices())
        run_batch(spark, pipeline, BatchPlan(pipeline.name, name, ranges),
                  read=generated_reader(workload))  # fmt: skip
    spark.stop()


if __name__ == "__main__":  # spark-submit of the warm-up, by `build_archive`
    _warm_up(Path(sys.argv[1]))
