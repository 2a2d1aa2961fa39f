"""DAG files import cleanly, and a broken pipeline config is an import error naming it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = """
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder={dags!r})
import json
errors = {{k: str(v) for k, v in bag.import_errors.items()}}
def shown(s):  # a cron or preset as written; else the kind of schedule
    if isinstance(s, list):
        return [type(x).__name__ for x in s]
    return s if s is None or isinstance(s, str) else type(s).__name__
schedules = {{k: shown(d.schedule) for k, d in bag.dags.items()}}
print(json.dumps({{"dags": sorted(bag.dags), "errors": errors, "schedules": schedules}}))
"""


def dagbag(pipelines_dir=None, dags=ROOT / "dags") -> dict:
    import json

    env = dict(os.environ)
    if pipelines_dir is not None:
        env["CDCLAKE_PIPELINES_DIR"] = str(pipelines_dir)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(dags=str(dags))],
        env=env, capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_dag_imports_without_errors():
    bag = dagbag()
    assert bag["errors"] == {}
    assert {
        "cdclake__demo", "cdclake_backfill", "cdclake_snapshot", "cdclake_maintenance__demo",
        "cdclake_dead_letters",
    } <= set(bag["dags"])  # fmt: skip


def test_a_broken_pipeline_config_is_an_import_error_and_the_other_pipelines_still_load(
    tmp_path,
):
    good = (ROOT / "include" / "pipelines" / "demo.yaml").read_text()
    (tmp_path / "a.yaml").write_text(good.replace("name: demo", "name: a"))
    bad = tmp_path / "shop.yaml"
    bad.write_text(
        good.replace("name: demo", "name: shop").replace("namespace: demo", "namespace: 9x")
    )
    twin = tmp_path / "z_copy.yaml"  # a copy that kept the first file's name
    twin.write_text(good.replace("name: demo", "name: a"))
    bag = dagbag(tmp_path)
    # one import error, of the file that checks the configs, naming both files and why
    [(path, message)] = bag["errors"].items()
    assert os.path.basename(path) == "cdclake_configs.py"
    assert f"{bad}: namespace:" in message and "'9x'" in message
    assert f"{twin}: name: 'a' is already used by {tmp_path / 'a.yaml'}" in message
    # the good pipeline's DAGs, and the manual ones, load as always
    assert {"cdclake__a", "cdclake_maintenance__a", "cdclake_backfill", "cdclake_snapshot"} <= set(
        bag["dags"]
    )
    assert not [d for d in bag["dags"] if d.endswith("__shop")]


def test_a_missing_pipelines_directory_is_an_import_error_naming_it(tmp_path):
    missing = tmp_path / "nowhere"
    bag = dagbag(missing)
    [(path, message)] = bag["errors"].items()
    assert os.path.basename(path) == "cdclake_configs.py"
    assert f"{missing}: pipelines directory does not exist" in message


def test_each_pipeline_is_maintained_on_its_own_schedule(tmp_path):
    good = (ROOT / "include" / "pipelines" / "demo.yaml").read_text()
    (tmp_path / "a.yaml").write_text(good.replace("name: demo", "name: a"))
    (tmp_path / "b.yaml").write_text(
        good.replace("name: demo", "name: b") + "maintenance: {schedule: '@weekly'}\n"
    )
    (tmp_path / "c.yaml").write_text(
        good.replace("name: demo", "name: c") + "maintenance: {enabled: false}\n"
    )
    bag = dagbag(tmp_path)
    assert bag["errors"] == {}
    assert bag["schedules"]["cdclake_maintenance__a"] == "@daily"
    assert bag["schedules"]["cdclake_maintenance__b"] == "@weekly"
    assert "cdclake__c" in bag["dags"] and "cdclake_maintenance__c" not in bag["dags"]


def test_a_watched_pipeline_runs_on_its_records_asset_and_its_cron(tmp_path):
    good = (ROOT / "include" / "pipelines" / "demo.yaml").read_text()
    (tmp_path / "a.yaml").write_text(good.replace("name: demo", "name: a") + "watch: {}\n")
    (tmp_path / "b.yaml").write_text(
        good.replace("name: demo", "name: b").replace('schedule: "*/5 * * * *"', "schedule: null")
        + "watch: {conn_id: kafka_b}\n"
    )
    bag = dagbag(tmp_path)
    assert bag["errors"] == {}
    assert bag["schedules"]["cdclake__a"] == "AssetOrTimeSchedule"  # records, or every 5 min
    assert bag["schedules"]["cdclake__b"] == ["Asset"]


@pytest.mark.parametrize(
    "old, new, expected",
    [
        pytest.param(
            'schedule: "*/5 * * * *"', 'schedule: "every 5 minutes"',
            "schedule: 'every 5 minutes' is not a cron expression", id="schedule in words",
        ),
        pytest.param(
            "kafka:\n", "kafka:\n  bootstrp_servers: x\n",
            "kafka.bootstrp_servers: unknown key (known: bootstrap_servers, format, properties, "
            "schema_registry)",
            id="unknown key",
        ),
        pytest.param(
            "namespace: demo\n", "namespace: demo\nnamespace: other\n",
            "namespace: duplicate key (lines", id="duplicate key",
        ),
        pytest.param(
            "namespace: demo\n", "namespace: demo\nmaintenance: {schedule: weekly}\n",
            "maintenance.schedule: 'weekly' is not a cron expression",
            id="maintenance schedule",
        ),
    ],
)  # fmt: skip
def test_a_broken_pipeline_file_never_hides_the_other_pipelines_dags(tmp_path, old, new, expected):
    good = (ROOT / "include" / "pipelines" / "demo.yaml").read_text()
    assert good.count(old) == 1
    (tmp_path / "a.yaml").write_text(good.replace("name: demo", "name: a"))
    bad = tmp_path / "b.yaml"
    bad.write_text(good.replace("name: demo", "name: b").replace(old, new))
    bag = dagbag(tmp_path)
    # the good pipeline's DAGs are there, none of the broken one's
    assert {"cdclake__a", "cdclake_maintenance__a"} <= set(bag["dags"])
    assert not [d for d in bag["dags"] if d.endswith("__b")]
    # one import error, of the DAG file without DAGs, naming the broken file and field
    [(path, message)] = bag["errors"].items()
    assert os.path.basename(path) == "cdclake_configs.py"
    assert f"{bad}: {expected}" in message


ISOLATED = """
from dataclasses import replace

from cdclake_airflow.factory import build_pipeline_dag
from cdclake_airflow.isolation import {use}


def build(pipeline):  # pipeline b with a schedule Airflow refuses (cdclake's check bypassed)
    if pipeline.name == "b":
        pipeline = replace(pipeline, schedule="every 5 minutes")
    return build_pipeline_dag(pipeline)


{call}
"""


def test_a_dag_airflow_refuses_is_left_out_and_reported_by_the_check(tmp_path):
    """Whatever Airflow refuses in one pipeline's DAG, the DAG file keeps the others: had
    it handed Airflow the refused DAG, Airflow would mark all of the file's DAGs broken."""
    pipelines, dags = tmp_path / "pipelines", tmp_path / "dags"
    pipelines.mkdir()
    dags.mkdir()
    good = (ROOT / "include" / "pipelines" / "demo.yaml").read_text()
    for name in ("a", "b", "c"):
        (pipelines / f"{name}.yaml").write_text(good.replace("name: demo", f"name: {name}"))
    (dags / "load.py").write_text(
        ISOLATED.format(use="build_isolated", call="globals().update(build_isolated(build).dags)")
    )
    (dags / "check.py").write_text(
        ISOLATED.format(use="raise_pipeline_errors", call="raise_pipeline_errors([build])")
    )
    bag = dagbag(pipelines, dags)
    assert bag["dags"] == ["cdclake__a", "cdclake__c"]
    [(path, message)] = bag["errors"].items()
    assert os.path.basename(path) == "check.py"
    assert f"{pipelines / 'b.yaml'}: its DAG was refused: AirflowTimetableInvalid:" in message
