"""The local stack's airflow.cfg: what `airflow standalone` needs so the scheduler's task
tokens are accepted by the api-server, and secrets that stay put and private."""

from __future__ import annotations

import configparser
import stat

import pytest
from cdclake.exceptions import CdclakeError
from cdclake_local import StackError
from cdclake_local.airflow_home import (
    API_PORT_ENV,
    PASSWORDS_FILE,
    api_port_from_env,
    write_config,
)


def read(cfg) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(cfg)
    return parser


def test_config_has_shared_secrets_the_api_address_and_the_admin_user(tmp_path):
    home = tmp_path / "airflow"
    cfg = read(write_config(tmp_path / "repo", home, api_port=18650))
    assert len(cfg["api_auth"]["jwt_secret"]) >= 32 and len(cfg["api"]["secret_key"]) >= 32
    assert cfg["api_auth"]["jwt_secret"] != cfg["api"]["secret_key"]
    assert cfg["api"]["host"] == "127.0.0.1" and cfg["api"]["port"] == "18650"
    assert cfg["api"]["base_url"] == "http://127.0.0.1:18650"
    assert cfg["core"]["execution_api_server_url"] == "http://127.0.0.1:18650/execution/"
    assert cfg["core"]["simple_auth_manager_users"] == "admin:admin"
    assert cfg["core"]["simple_auth_manager_passwords_file"] == str(home / PASSWORDS_FILE)
    assert cfg["core"]["dags_folder"] == str(tmp_path / "repo" / "dags")
    assert cfg["core"]["parallelism"] == "4"  # not 32 forked task runners on 2 cores


def test_secrets_are_made_once_kept_on_rewrite_and_readable_by_the_owner_only(tmp_path):
    home = tmp_path / "airflow"
    first = read(write_config(tmp_path, home, api_port=8080))
    again = read(write_config(tmp_path, home, api_port=18651))  # `local up` again, new port
    assert again["api"]["port"] == "18651"
    for section, option in (("api_auth", "jwt_secret"), ("api", "secret_key")):
        assert again[section][option] == first[section][option]
    other = read(write_config(tmp_path, tmp_path / "other", api_port=8080))
    assert other["api_auth"]["jwt_secret"] != first["api_auth"]["jwt_secret"]
    for path in (home / "airflow.cfg", home / PASSWORDS_FILE):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_an_existing_password_file_is_kept_and_made_private(tmp_path):
    home = tmp_path / "airflow"
    home.mkdir()
    (home / PASSWORDS_FILE).write_text('{"admin": "kept"}\n')
    (home / PASSWORDS_FILE).chmod(0o644)
    write_config(tmp_path, home, api_port=8080)
    assert (home / PASSWORDS_FILE).read_text() == '{"admin": "kept"}\n'
    assert stat.S_IMODE((home / PASSWORDS_FILE).stat().st_mode) == 0o600


@pytest.mark.parametrize(
    "value, port",
    [
        (None, 8080),  # unset: Airflow's usual port
        ("", 8080),  # empty: as unset
        ("18600", 18600),  # moved
    ],
)
def test_api_port_from_the_environment(monkeypatch, value, port):
    if value is None:
        monkeypatch.delenv(API_PORT_ENV, raising=False)
    else:
        monkeypatch.setenv(API_PORT_ENV, value)
    assert api_port_from_env() == port


@pytest.mark.parametrize("value", ["http", "-1", "0", "65536", "80.5"])
def test_a_bad_api_port_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(API_PORT_ENV, value)
    with pytest.raises(StackError, match=rf"^{API_PORT_ENV}: '{value}' is not a TCP port"):
        api_port_from_env()


def test_stack_errors_belong_to_the_local_tools_and_are_cdclake_errors():
    import cdclake.exceptions

    assert not hasattr(cdclake.exceptions, "StackError")
    assert issubclass(StackError, CdclakeError)
