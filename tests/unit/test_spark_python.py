"""Which Python a load's driver and executors run (cdclake.spark): spark-submit reads the
settings before the environment, whatever the master."""

from __future__ import annotations

import dataclasses
import sys

from cdclake.pipeline_file import load_pipeline
from cdclake.spark import DRIVER_PYTHON, PYTHON, launch_conf, spark_conf

from tests.conftest import DEMO_PIPELINE


def conf_with(own: dict[str, str]) -> dict[str, str]:
    pipeline = load_pipeline(DEMO_PIPELINE)
    spark = dataclasses.replace(pipeline.spark, conf={"spark.jars": "/jars/x.jar", **own})
    return launch_conf(dataclasses.replace(pipeline, spark=spark))


def test_driver_and_executors_run_this_python_by_default():
    conf = conf_with({})
    assert conf[PYTHON] == conf[DRIVER_PYTHON] == sys.executable


def test_a_pipeline_names_the_executors_python_and_the_driver_keeps_this_one():
    conf = conf_with({PYTHON: "/opt/env/bin/python", "spark.authenticate.secret": "s3cr3t"})
    assert conf[PYTHON] == "/opt/env/bin/python"
    assert conf[DRIVER_PYTHON] == sys.executable  # the driver must import cdclake here
    assert "spark.authenticate.secret" not in conf  # the driver sets it on its session


def test_spark_logs_at_warn_unless_the_pipeline_asks_for_more():
    pipeline = load_pipeline(DEMO_PIPELINE)
    assert spark_conf(pipeline)["spark.log.level"] == "WARN"
    spark = dataclasses.replace(pipeline.spark, conf={"spark.log.level": "INFO"})
    assert spark_conf(dataclasses.replace(pipeline, spark=spark))["spark.log.level"] == "INFO"
