"""A session a CLI command starts keeps the catalog's password off the JVM's command line
(what `ps` shows) and still reaches the catalog with it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from tests.conftest import DEMO_PIPELINE, ROOT

pytestmark = pytest.mark.integration

SCRIPT = """
import sys
from pathlib import Path
from cdclake.pipeline_file import load_pipeline
from cdclake.spark import build_session

pipeline = load_pipeline(Path(sys.argv[1]))
spark = build_session(pipeline, "local[1]")
spark.sql(f"SHOW NAMESPACES IN {pipeline.catalog.name}").collect()  # the catalog loads
print(spark.conf.get(f"spark.sql.catalog.{pipeline.catalog.name}.jdbc.password"))
pid = spark.sparkContext._gateway.proc.pid
print(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode())
spark.stop()
"""


def test_the_catalog_password_stays_off_the_jvm_command_line(stack):
    marker = f"pw-{uuid.uuid4().hex}"  # the local server trusts loopback: any password works
    env = {**os.environ, "CDCLAKE_CATALOG_PASSWORD": marker}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(DEMO_PIPELINE)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    setting, cmdline = done.stdout.strip().splitlines()[-2:]
    assert setting == marker  # the session has it
    assert "org.apache.spark.deploy.SparkSubmit" in cmdline
    assert marker not in cmdline
