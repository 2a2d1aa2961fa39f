"""An AIRFLOW_HOME for the local stack: config, migrated metadata DB, connections."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cdclake.exceptions import StackError

_CFG = """[core]
dags_folder = {root}/dags
plugins_folder = {root}/plugins
load_examples = False
executor = LocalExecutor
dags_are_paused_at_creation = True

[database]
sql_alchemy_conn = sqlite:///{home}/airflow.db

[logging]
base_log_folder = {home}/logs

[dag_processor]
refresh_interval = 30
"""


def airflow_env(home: Path) -> dict[str, str]:
    """Environment under which Airflow commands and DAG runs see this AIRFLOW_HOME."""
    bindir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if bindir not in path.split(os.pathsep):
        path = bindir + os.pathsep + path
    return {**os.environ, "AIRFLOW_HOME": str(home), "PATH": path}


def connections(pg_port: int, kafka_bootstrap: str, dbname: str) -> dict[str, dict]:
    return {
        "spark_default": {"conn_type": "spark", "host": "local[2]"},
        "cdclake_source": {
            "conn_type": "postgres",
            "host": "127.0.0.1",
            "port": pg_port,
            "login": "postgres",
            "schema": dbname,
        },
        "cdclake_kafka": {
            "conn_type": "generic",
            "extra": json.dumps({"bootstrap.servers": kafka_bootstrap}),
        },
    }


def setup_airflow_home(root: Path, home: Path, conns: dict[str, dict]) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "airflow.cfg").write_text(_CFG.format(root=root, home=home))
    env = airflow_env(home)
    airflow = str(Path(sys.executable).parent / "airflow")
    marker = home / ".migrated"
    if not marker.exists():
        _run([airflow, "db", "migrate"], env, "airflow db migrate")
        marker.write_text("ok\n")
    conn_file = home / "connections.json"
    conn_file.write_text(json.dumps(conns, indent=2))
    _run([airflow, "connections", "import", "--overwrite", str(conn_file)], env,
         "airflow connections import")  # fmt: skip


def _run(cmd: list[str], env: dict[str, str], what: str) -> None:
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise StackError(f"{what} failed:\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}")
