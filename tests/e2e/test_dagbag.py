"""DAG files import cleanly, and a broken pipeline config is an import error naming it."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = """
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder={dags!r})
import json
errors = {{k: str(v) for k, v in bag.import_errors.items()}}
schedules = {{k: d.schedule for k, d in bag.dags.items()}}
print(json.dumps({{"dags": sorted(bag.dags), "errors": errors, "schedules": schedules}}))
"""


def dagbag(pipelines_dir=None) -> dict:
    import json

    env = dict(os.environ)
    if pipelines_dir is not None:
        env["CDCLAKE_PIPELINES_DIR"] = str(pipelines_dir)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(dags=str(ROOT / "dags"))],
        env=env, capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_dag_imports_without_errors():
    bag = dagbag()
    assert bag["errors"] == {}
    assert {
        "cdclake__demo", "cdclake_backfill", "cdclake_snapshot", "cdclake_maintenance__demo",
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
