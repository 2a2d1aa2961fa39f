"""Settings of the local stack read from the environment."""

from __future__ import annotations

from cdclake.local.stack import StackSettings


def test_a_relative_state_dir_is_made_absolute(monkeypatch, tmp_path):
    """PostgreSQL runs with a working directory of its own: a relative state directory
    (as README's example gives) must not reach it as such."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CDCLAKE_STATE_DIR", ".cdclake/bench-stack")
    monkeypatch.setenv("CDCLAKE_PG_PORT", "55482")
    s = StackSettings.from_env()
    assert s.state_dir == tmp_path / ".cdclake" / "bench-stack"
    assert s.state_dir.is_absolute() and s.pg_port == 55482
