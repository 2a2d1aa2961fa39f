"""An AIRFLOW_HOME for the local stack: config, migrated metadata DB, connections.

The config is what `airflow standalone` (or api-server, scheduler, dag-processor and
triggerer started one by one) needs: the api-server on loopback at a port of its own
(`CDCLAKE_AIRFLOW_PORT`, default 8080), the execution API the workers report to at that
address, the secrets every component must share to trust each other's tokens (random,
generated once and kept in the file, which only its owner may read), and the simple auth
manager's `admin` user, whose password Airflow generates into the home on first start.
"""

from __future__ import annotations

import configparser
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from cdclake_local import StackError
from cdclake_local.procs import write_private

API_PORT_ENV = "CDCLAKE_AIRFLOW_PORT"
DEFAULT_API_PORT = 8080
API_HOST = "127.0.0.1"
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"
ADMIN_USER = "admin"

# (section, option) of the secrets shared by the components, kept across rewrites
_SECRETS = (("api_auth", "jwt_secret"), ("api", "secret_key"))

# LocalExecutor forks `parallelism` worker processes when it starts (32 by default): four
# run more loads at once than two cores can take, each a spark-submit of its own
_CFG = """[core]
dags_folder = {root}/dags
plugins_folder = {root}/plugins
load_examples = False
executor = LocalExecutor
parallelism = 4
dags_are_paused_at_creation = True
execution_api_server_url = {url}/execution/
simple_auth_manager_users = {admin}:admin
simple_auth_manager_passwords_file = {home}/{passwords}

[database]
sql_alchemy_conn = sqlite:///{home}/airflow.db

[logging]
base_log_folder = {home}/logs

[dag_processor]
refresh_interval = 30

[api]
host = {host}
port = {port}
base_url = {url}
secret_key = {api_secret_key}

[api_auth]
jwt_secret = {api_auth_jwt_secret}
"""


def api_port_from_env() -> int:
    """The api-server's port: `CDCLAKE_AIRFLOW_PORT`, else 8080."""
    raw = os.environ.get(API_PORT_ENV, "").strip()
    if not raw:
        return DEFAULT_API_PORT
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise StackError(f"{API_PORT_ENV}: {raw!r} is not a TCP port (1-65535)")
    return int(raw)


def api_url(port: int) -> str:
    return f"http://{API_HOST}:{port}"


def airflow_env(home: Path) -> dict[str, str]:
    """Environment under which Airflow commands and DAG runs see this AIRFLOW_HOME."""
    bindir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if bindir not in path.split(os.pathsep):
        path = bindir + os.pathsep + path
    return {**os.environ, "AIRFLOW_HOME": str(home), "PATH": path}


def kafka_connection(kafka: Mapping[str, str], group: str) -> dict:
    """An Airflow connection of the Kafka provider for a pipeline's `watch:`: the
    librdkafka settings `kafka` (bootstrap servers and SASL login), the watcher's own
    consumer group, and no offset commits (each start waits at the end of the topics)."""
    extra = {**kafka, "group.id": group, "enable.auto.commit": "false"}
    return {"conn_type": "kafka", "extra": json.dumps(extra)}


def connections(pg_port: int, kafka: Mapping[str, str], dbname: str) -> dict[str, dict]:
    """The stack's Airflow connections; `cdclake_kafka` is the demo pipeline's watch
    connection (`kafka_connection`)."""
    return {
        "spark_default": {"conn_type": "spark", "host": "local[2]"},
        "cdclake_source": {
            "conn_type": "postgres",
            "host": "127.0.0.1",
            "port": pg_port,
            "login": "postgres",
            "schema": dbname,
        },
        "cdclake_kafka": kafka_connection(kafka, "cdclake-watch-demo"),
    }


def render_config(root: Path, home: Path, port: int, kept: dict[str, str]) -> str:
    """airflow.cfg for `home`; `kept` holds the secrets by `<section>_<option>`."""
    return _CFG.format(
        root=root, home=home, host=API_HOST, port=port, url=api_url(port), admin=ADMIN_USER,
        passwords=PASSWORDS_FILE, **kept,
    )  # fmt: skip


def kept_secrets(cfg: Path) -> dict[str, str]:
    """The shared secrets of an existing airflow.cfg; new random ones where it has none."""
    parser = configparser.ConfigParser(interpolation=None)
    if cfg.exists():
        try:
            parser.read(cfg)
        except configparser.Error as exc:
            raise StackError(f"{cfg}: cannot be read to keep its secrets: {exc}") from exc
    return {
        f"{section}_{option}": parser.get(section, option, fallback="").strip()
        or secrets.token_urlsafe(48)
        for section, option in _SECRETS
    }


def write_config(root: Path, home: Path, api_port: int | None = None) -> Path:
    """airflow.cfg of `home` (api port: `api_port`, else `api_port_from_env()`), its
    secrets kept from the file it replaces, and the simple auth manager's password file,
    both readable by their owner only (Airflow appends to the latter, keeping its mode)."""
    port = api_port if api_port is not None else api_port_from_env()
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "airflow.cfg"
    write_private(cfg, render_config(root, home, port, kept_secrets(cfg)))
    passwords = home / PASSWORDS_FILE
    if passwords.exists():
        passwords.chmod(0o600)
    else:
        write_private(passwords, "")
    return cfg


def setup_airflow_home(
    root: Path, home: Path, conns: dict[str, dict], api_port: int | None = None
) -> None:
    """Write the config, migrate the metadata DB once and import the connections."""
    write_config(root, home, api_port)
    env = airflow_env(home)
    airflow = str(Path(sys.executable).parent / "airflow")
    marker = home / ".migrated"
    if not marker.exists():
        _run([airflow, "db", "migrate"], env, "airflow db migrate")
        marker.write_text("ok\n")
    conn_file = home / "connections.json"
    write_private(conn_file, json.dumps(conns, indent=2))  # it holds the Kafka password
    _run([airflow, "connections", "import", "--overwrite", str(conn_file)], env,
         "airflow connections import")  # fmt: skip
    db = home / "airflow.db"  # the connections' secrets (the Kafka login) are in it too
    if db.exists():
        db.chmod(0o600)


def _run(cmd: list[str], env: dict[str, str], what: str) -> None:
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise StackError(f"{what} failed:\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}")
