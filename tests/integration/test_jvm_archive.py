"""`cdclake jvm-archive`: the warm-up writes an archive a driver JVM really maps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cdclake.jvm import ARCHIVE_ENV, DRIVER_OPTIONS, archive_path, driver_java_options
from cdclake_bench.jvm_archive import build_archive

pytestmark = pytest.mark.integration

APP = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.getOrCreate()
print("rows", spark.range(5).count())
spark.stop()
"""


def test_the_archive_is_built_once_and_mapped_by_a_driver(tmp_path):
    """The environment's own archive: the session's prebuild (tests/conftest.py) or this
    test builds it, and every later spark-submit of the suite maps it."""
    archive = archive_path()
    if archive is None:
        pytest.skip(f"{ARCHIVE_ENV}=off")
    assert build_archive() == archive and archive.stat().st_size > 10_000_000
    assert not list(archive.parent.glob(f".{archive.name}.*partial"))  # renamed when done
    built = archive.stat().st_mtime_ns
    assert build_archive() == archive and archive.stat().st_mtime_ns == built  # kept

    # -Xshare:on makes the JVM fail instead of running without an archive it cannot map
    options = driver_java_options(100) + " -Xshare:on"
    app = tmp_path / "app.py"
    app.write_text(APP)
    spark_submit = Path(sys.executable).parent / "spark-submit"
    done = subprocess.run(
        [str(spark_submit), "--master", "local[1]", "--conf", f"{DRIVER_OPTIONS}={options}",
         str(app)],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable}, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "rows 5"  # nothing of the JVM's on stdout
