"""Settings of the local stack read from the environment."""

from __future__ import annotations

from pathlib import Path

from cdclake.local.stack import StackSettings

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
    from cdclake.config import load_pipeline
    from cdclake.local.stack import LocalStack

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
