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
print(json.dumps({{"dags": sorted(bag.dags), "errors": errors}}))
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
    assert {"cdclake__demo", "cdclake_backfill", "cdclake_snapshot"} <= set(bag["dags"])


def test_broken_pipeline_config_is_an_import_error_naming_file_and_field(tmp_path):
    good = (ROOT / "include" / "pipelines" / "demo.yaml").read_text()
    bad = tmp_path / "shop.yaml"
    bad.write_text(
        good.replace("name: demo", "name: shop").replace("namespace: demo", "namespace: 9x")
    )
    bag = dagbag(tmp_path)
    assert {os.path.basename(p) for p in bag["errors"]} == {
        "cdclake_pipelines.py",
        "cdclake_manual.py",
    }
    for message in bag["errors"].values():
        assert str(bad) in message and "namespace" in message
