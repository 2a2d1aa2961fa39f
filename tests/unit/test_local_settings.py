"""Settings of the local stack read from the environment."""

from __future__ import annotations

from pathlib import Path

from cdclake_local.stack import StackSettings

ROOT = Path(__file__).resolve().parents[2]


def test_a_relative_state_dir_is_made_absolute(monkeypatch, tmp_path):
    """PostgreSQL runs with a working directory of its own: a relative state directory
    (as README's example gives) must not reach it as such."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CDCLAKE_STATE_DIR", ".cdclake/bench-stack")
    monkeypatch.setenv("CDCLAKE_PG_PORT", "55482")
    s = StackSettings.from_env()
    assert s.state_dir == tmp_path / ".cdclake" / "bench-stack"
    assert s.state_dir.is_absolute() and s.pg_port == 55482


def test_local_env_points_the_demo_pipeline_at_a_moved_stack(monkeypatch, tmp_path):
    """`eval "$(cdclake local env)"` is all the README's Airflow steps give the shell: on a
    stack moved to other ports and another state directory, the demo pipeline must reach
    that stack's catalog and warehouse, not the default stack's."""
    from cdclake.pipeline_file import load_pipeline
    from cdclake_local.stack import LocalStack

    monkeypatch.setenv("CDCLAKE_STATE_DIR", str(tmp_path / "moved"))
    monkeypatch.setenv("CDCLAKE_PG_PORT", "55499")
    monkeypatch.setenv("CDCLAKE_KAFKA_PORT", "19099")
    exported = LocalStack(StackSettings.from_env()).env()
    for name, value in exported.items():
        monkeypatch.setenv(name, value)

    demo = load_pipeline(ROOT / "include" / "pipelines" / "demo.yaml")
    assert demo.catalog.uri == "jdbc:postgresql://127.0.0.1:55499/cdclake_catalog"
    assert demo.catalog.warehouse == (tmp_path / "moved" / "warehouse").as_uri()
    assert demo.kafka.bootstrap_servers == "127.0.0.1:19099"
    # and log in to that stack's Kafka with its SASL password, kept in its state directory
    password = (tmp_path / "moved" / "kafka" / "password").read_text().strip()
    assert len(password) >= 24
    assert (tmp_path / "moved" / "kafka" / "password").stat().st_mode & 0o777 == 0o600
    client = demo.kafka.client_config()
    assert client["security.protocol"] == "SASL_PLAINTEXT"
    assert client["sasl.mechanism"] == "PLAIN"
    assert (client["sasl.username"], client["sasl.password"]) == ("cdclake", password)


def test_local_env_and_status_never_print_the_kafka_password(monkeypatch, tmp_path):
    """`local env` has the shell read the password from its file; `status` names the file."""
    import json
    import subprocess

    from cdclake_local.stack import LocalStack

    monkeypatch.setenv("CDCLAKE_STATE_DIR", str(tmp_path / "s"))
    stack = LocalStack(StackSettings.from_env())
    password = stack.broker.password()
    lines = stack.env_exports()
    status = json.dumps(stack.status())
    assert password not in "\n".join(lines) and password not in status
    assert json.loads(status)["kafka"]["password_file"] == str(stack.broker.password_file)
    script = "\n".join([*lines, 'printf %s "$CDCLAKE_KAFKA_PASSWORD"'])
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=10)
    assert done.stdout == password


def test_a_pipeline_without_the_kafka_login_variables_logs_in_to_nothing(monkeypatch):
    """The demo pipeline's SASL settings are empty without the variables: left out, so a
    broker without authentication is reached in PLAINTEXT."""
    from cdclake.pipeline_file import load_pipeline

    for name in ("CDCLAKE_KAFKA_SECURITY_PROTOCOL", "CDCLAKE_KAFKA_SASL_MECHANISM",
                 "CDCLAKE_KAFKA_USER", "CDCLAKE_KAFKA_PASSWORD"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    client = load_pipeline(ROOT / "include/pipelines/demo.yaml").kafka.client_config()
    assert client["security.protocol"] == "PLAINTEXT"
    assert not [k for k in client if k.startswith("sasl.")], client


def test_the_airflow_connection_cdclake_kafka_carries_the_kafka_login_and_watch_settings():
    import json

    from cdclake_local.airflow_home import connections

    login = {"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SASL_PLAINTEXT",
             "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"}  # fmt: skip
    conn = connections(1, login, "db")["cdclake_kafka"]
    assert conn["conn_type"] == "kafka"
    watch = {"group.id": "cdclake-watch-demo", "enable.auto.commit": "false"}
    assert json.loads(conn["extra"]) == login | watch
