"""Lake freshness on the local stack: `cdclake status`, the Airflow plugin page behind
Airflow's authentication (in-process app and a real api-server seen by headless Chromium).

One pipeline of two new tables: `a` is loaded, changed, loaded again (so its snapshot holds
position deletes); `b` is loaded once and then, some seconds later, gets inserts that are
never loaded: b is behind the source by their age, not by the age of what it holds. A real
DAG run of the pipeline (with nothing to load, so it emits no asset event) gives the page a
last run to link to.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from cdclake.config import PipelineConfig
from cdclake.iceberg.catalog import load_catalog
from cdclake.offsets import SUMMARY_OFFSETS, decode_offsets
from cdclake_control.watermarks import fetch_watermarks
from cdclake_local.airflow_server import api_token, free_port

from tests.conftest import ROOT
from tests.e2e.chromium import Chromium, chromium_binary
from tests.e2e.helpers import asset_events
from tests.e2e.test_demo_dag import run_dag
from tests.integration.helpers import load_all, make_pipeline

pytestmark = pytest.mark.e2e

B_UNLOADED = 7


@dataclass(frozen=True)
class Lake:
    pipeline: PipelineConfig
    pipelines_dir: Path
    table_a: str  # qualified Iceberg names
    table_b: str
    source_rows_a: int
    loaded_rows_b: int
    b_loaded_ts_ms: tuple[int, int]  # window in which b's loaded rows were written
    b_unloaded_ts_ms: tuple[int, int]  # window in which b's unloaded rows were written
    batch_a: str
    batch_b: str
    dag_id: str
    run_id: str
    run_state: str


def now_ms() -> int:
    return int(time.time() * 1000)


def sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def count(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f"select count(*) from {table}").fetchone()[0]


@pytest.fixture(scope="module")
def lake(stack, spark, tmp_path_factory):
    n = uuid.uuid4().hex[:6]
    a, b = f"inventory.fresh_a_{n}", f"inventory.fresh_b_{n}"
    dsn = stack.source_dsn
    sql(
        dsn,
        f"create table {a} (id int primary key, v text)",
        f"create table {b} (id int primary key, v text)",
        f"insert into {a} select i, 'a' || i from generate_series(1, 50) i",
    )
    b_from = now_ms()
    sql(dsn, f"insert into {b} select i, 'b' || i from generate_series(1, 30) i")
    b_to = now_ms()

    root = tmp_path_factory.mktemp("freshness")
    pipelines_dir = root / "pipelines"
    pipelines_dir.mkdir()
    name = f"fresh_{n}"
    pipeline = make_pipeline(pipelines_dir, name, [a, b])
    load_all(stack, spark, pipeline, f"{name}-1")

    # a changes and is loaded on its own: its snapshot now holds position deletes
    sql(dsn, f"update {a} set v = 'changed' where id <= 10", f"delete from {a} where id > 45")
    (root / "only_a").mkdir()
    load_all(stack, spark, make_pipeline(root / "only_a", name, [a]), f"{name}-2")

    os.environ["CDCLAKE_PIPELINES_DIR"] = str(pipelines_dir)
    try:
        run = run_dag(f"cdclake__{name}")  # nothing to load: plan, skip, report
    except BaseException:
        os.environ.pop("CDCLAKE_PIPELINES_DIR")
        raise

    assert asset_events(run) == {}  # nothing loaded, nothing changed
    # b gets rows that are never loaded, well after those it holds were written
    time.sleep(max(0.0, 5 - (now_ms() - b_to) / 1000))
    late_from = now_ms()
    sql(dsn, f"insert into {b} select i, 'late' from generate_series(31, {30 + B_UNLOADED}) i")
    late_to = now_ms()
    stack.wait_for_capture()

    yield Lake(
        pipeline=pipeline,
        pipelines_dir=pipelines_dir,
        table_a=f"lake.{name}.fresh_a_{n}",
        table_b=f"lake.{name}.fresh_b_{n}",
        source_rows_a=count(dsn, a),
        loaded_rows_b=30,
        b_loaded_ts_ms=(b_from, b_to),
        b_unloaded_ts_ms=(late_from, late_to),
        batch_a=f"{name}-2-0",
        batch_b=f"{name}-1-0",
        dag_id=run.dag_id,
        run_id=run.run_id,
        run_state=str(run.state),
    )
    os.environ.pop("CDCLAKE_PIPELINES_DIR", None)


def current_snapshot(pipeline: PipelineConfig, qualified: str):
    cat = load_catalog(pipeline.catalog)
    return cat.load_table(tuple(qualified.split(".")[1:])).current_snapshot()


def expected_behind(pipeline: PipelineConfig, index: int) -> int:
    """Kafka's high watermark minus the offsets in the table's snapshot summary."""
    table = pipeline.tables[index]
    snap = current_snapshot(pipeline, pipeline.qualified_target(table))
    committed = decode_offsets(snap.summary.additional_properties[SUMMARY_OFFSETS])
    marks = fetch_watermarks(pipeline.kafka, [pipeline.topic_for(table)])
    return sum(m.high - committed[tp] for tp, m in marks.items())


def assert_figures(lake: Lake, rows: list[dict], asked: tuple[int, int]) -> None:
    """`rows` were computed between the times in `asked` (ms)."""
    by_table = {r["table"]: r for r in rows}
    a, b = by_table[lake.table_a], by_table[lake.table_b]

    assert a["exists"] and b["exists"]
    assert a["rows"] == lake.source_rows_a == 45  # 50 inserted, 5 deleted
    summary_a = current_snapshot(lake.pipeline, lake.table_a).summary.additional_properties
    assert int(summary_a["total-position-deletes"]) >= 15  # 10 updated + 5 deleted rows
    assert a["offsets_behind"] == 0 == expected_behind(lake.pipeline, 0)
    assert a["seconds_behind_source"] == 0.0
    assert a["batch_id"] == lake.batch_a
    assert a["last_commit_ms"] == current_snapshot(lake.pipeline, lake.table_a).timestamp_ms

    assert b["rows"] == lake.loaded_rows_b
    assert b["offsets_behind"] == B_UNLOADED == expected_behind(lake.pipeline, 1)
    assert b["batch_id"] == lake.batch_b
    assert b["last_commit_ms"] == current_snapshot(lake.pipeline, lake.table_b).timestamp_ms
    # behind the source by the age of the oldest change b does not hold yet (its source
    # commit time), not by the age of the newest one it holds (5+ s older)
    lo, hi = lake.b_unloaded_ts_ms
    seconds = b["seconds_behind_source"]
    assert (asked[0] - hi) / 1000 - 1 <= seconds <= (asked[1] - lo) / 1000 + 1
    assert seconds < (asked[0] - lake.b_loaded_ts_ms[1]) / 1000 - 3


def cli(*args: str) -> subprocess.CompletedProcess:
    """The CLI in its own process; CDCLAKE_PIPELINES_DIR (set by `lake`) is the default."""
    return subprocess.run(
        [sys.executable, "-m", "cdclake", "status", *args],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip


def test_status_json_and_table_match_kafka_and_iceberg(lake):
    before = now_ms()
    rows = json.loads(cli("--pipeline", str(lake.pipeline.path), "--json").stdout)
    assert [r["table"] for r in rows] == [lake.table_a, lake.table_b]
    assert_figures(lake, rows, (before, now_ms()))

    # without --pipeline: every pipeline of the directory, as an aligned table
    text = cli().stdout.splitlines()
    header = re.split(r"\s{2,}", text[0])
    assert header == [
        "TABLE",
        "LAST COMMIT",
        "OFFSETS BEHIND",
        "BEHIND SOURCE",
        "ROWS",
        "BATCH",
        "NOTES",
    ]
    cells = {line.split()[0]: re.split(r"\s{2,}", line) for line in text[1:]}
    assert cells[lake.table_a][2:5] == ["0", "0s", "45"]
    assert cells[lake.table_b][2] == str(B_UNLOADED) and cells[lake.table_b][4] == "30"
    assert cells[lake.table_b][5] == lake.batch_b
    end = text[0].index("ROWS") + len("ROWS")  # numbers are right-aligned under their header
    assert all(line[end - 1] != " " and line[end] == " " for line in text)


@pytest.fixture(scope="module")
def airflow_app():
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    return TestClient(create_app())


def admin_token() -> str:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    user = SimpleAuthManagerUser(username="admin", role="admin")
    return get_auth_manager().generate_jwt(user)


def test_page_requires_a_valid_token(lake, airflow_app):
    for path in ("/cdclake/freshness", "/cdclake/freshness.json"):
        assert airflow_app.get(path).status_code == 401
        bad = airflow_app.get(path, headers={"Authorization": "Bearer not-a-jwt"})
        assert bad.status_code == 403
        forged = admin_token()[:-4] + "AAAA"  # signature no longer matches
        assert airflow_app.get(path, cookies={"_token": forged}).status_code == 403


def set_paused(dag_id: str, paused: bool) -> None:
    """As the UI's pause toggle does, in Airflow's metadata DB."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id == dag_id).values(is_paused=paused))


def test_page_and_json_show_every_table_with_its_figures(lake, airflow_app):
    token = admin_token()
    set_paused(lake.dag_id, False)
    before = now_ms()
    resp = airflow_app.get("/cdclake/freshness.json", headers={"Authorization": f"Bearer {token}"})
    asked = (before, now_ms())
    assert resp.status_code == 200
    [pipe] = resp.json()["pipelines"]
    assert pipe["dag_id"] == lake.dag_id and pipe["error"] is None
    assert pipe["last_run"]["state"] == lake.run_state == "success"
    # the Airflow UI's pages of the DAG and of its last run
    assert pipe["dag_state"] == "active" and pipe["dag_url"] == f"/dags/{lake.dag_id}"
    assert pipe["last_run"]["run_id"] == lake.run_id
    assert pipe["last_run"]["url"] == f"/dags/{lake.dag_id}/runs/{lake.run_id}"
    assert_figures(lake, pipe["tables"], asked)

    page = airflow_app.get("/cdclake/freshness", cookies={"_token": token})  # as the UI sends it
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    body = page.text
    for expected in (lake.table_a, lake.table_b, lake.batch_a, lake.batch_b, "last run: success"):
        assert expected in body
    # relative to /cdclake/
    assert f'<a href="../dags/{lake.dag_id}" target="_top" class="ui">' in body
    assert f'<a href="../dags/{lake.dag_id}/runs/{lake.run_id}" target="_top"' in body
    assert ">active</span>" in body
    row_b = re.search(rf"<tr><td class=\"table\">{re.escape(lake.table_b)}</td>.*?</tr>", body)
    assert row_b and f">{B_UNLOADED}</span>" in row_b.group(0) and ">30</td>" in row_b.group(0)

    # loaded without errors and linked in the UI navigation
    auth = {"Authorization": f"Bearer {token}"}
    errors = airflow_app.get("/api/v2/plugins/importErrors", headers=auth).json()
    assert not [e for e in errors["import_errors"] if "cdclake" in json.dumps(e)], errors
    plugins = airflow_app.get("/api/v2/plugins", headers=auth)
    views = [v for p in plugins.json()["plugins"] for v in p["external_views"]]
    assert {"name": "Lake freshness", "href": "/cdclake/freshness"}.items() <= next(
        v for v in views if v["name"] == "Lake freshness"
    ).items()


def test_a_broken_config_is_listed_with_its_error_beside_the_pipelines_that_load(lake, airflow_app):
    broken = lake.pipelines_dir / "broken.yaml"
    broken.write_text(lake.pipeline.path.read_text().replace("namespace:", "namespace: 9x #"))
    try:
        resp = airflow_app.get(
            "/cdclake/freshness.json", headers={"Authorization": f"Bearer {admin_token()}"}
        )
    finally:
        broken.unlink()
    assert resp.status_code == 200
    good, bad = resp.json()["pipelines"]
    assert good["dag_id"] == lake.dag_id and good["error"] is None and good["tables"]
    assert bad["name"] == "broken" and bad["tables"] == []
    assert bad["error"].startswith(f"{broken}: namespace:") and "'9x'" in bad["error"]


def test_a_paused_and_a_missing_dag_are_shown(lake, airflow_app):
    """The pipeline's DAG paused in Airflow; another pipeline whose DAG Airflow never
    parsed (no row in its metadata DB): each says so, and loads nothing."""
    other = lake.pipelines_dir / "no_dag.yaml"
    other.write_text(re.sub(r"(?m)^name: .*$", "name: no_dag_yet", lake.pipeline.path.read_text()))
    set_paused(lake.dag_id, True)
    try:
        token = admin_token()
        resp = airflow_app.get(
            "/cdclake/freshness.json", headers={"Authorization": f"Bearer {token}"}
        )
        page = airflow_app.get("/cdclake/freshness", cookies={"_token": token}).text
    finally:
        other.unlink()
        set_paused(lake.dag_id, False)
    assert resp.status_code == 200
    views = {p["name"]: p for p in resp.json()["pipelines"]}
    paused, missing = views[lake.pipeline.name], views["no_dag_yet"]
    assert paused["dag_state"] == "paused" and paused["last_run"]["run_id"] == lake.run_id
    assert missing["dag_state"] == "missing" and missing["last_run"] is None
    assert missing["dag_id"] == "cdclake__no_dag_yet"
    sections = dict(re.findall(r"<section><h2>(\w+) (.*?)</section>", page))
    assert ">paused: no scheduled loads</span>" in sections[lake.pipeline.name]
    assert ">DAG missing: nothing loads this pipeline</span>" in sections["no_dag_yet"]
    assert "../dags/cdclake__no_dag_yet" not in sections["no_dag_yet"]


@pytest.fixture
def api_server(lake, tmp_path):
    """A real `airflow api-server` on the test AIRFLOW_HOME; yields (base url, password)."""
    password = secrets.token_urlsafe(16)
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps({"admin": password}))
    port = free_port()
    env = {
        **os.environ,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    log = (tmp_path / "api-server.log").open("wb")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "airflow"), "api-server", "--apps", "core",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        "api-server did not come up:\n"
                        + (tmp_path / "api-server.log").read_text()[-3000:]
                    ) from None
                time.sleep(1)
        yield base, password
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.mark.skipif(chromium_binary() is None, reason="chromium is not installed")
def test_screenshot_of_the_page_in_a_real_api_server(lake, api_server, tmp_path):
    base, password = api_server
    page_url = f"{base}/cdclake/freshness"
    with Chromium(chromium_binary()) as browser:
        browser.open(page_url)  # no cookie yet: Airflow's 401, not the page
        assert "Not authenticated" in browser.evaluate("document.body.innerText")

        browser.set_cookie(base, "_token", api_token(base, password))
        browser.open(page_url)
        text = browser.evaluate("document.body.innerText")
        hrefs = browser.evaluate("[...document.querySelectorAll('a')].map(a => a.href)")
        png = browser.screenshot(tmp_path / "freshness.png")
        height = browser.evaluate("document.documentElement.scrollHeight")

    assert "Lake freshness" in text and lake.table_a in text and lake.table_b in text
    assert "last run: success" in text
    # the links resolve to the Airflow UI's pages of the DAG and its last run
    dag_url, run_url = f"{base}/dags/{lake.dag_id}", f"{base}/dags/{lake.dag_id}/runs/{lake.run_id}"
    assert {dag_url, run_url} <= set(hrefs)
    for url in (dag_url, run_url):
        with urllib.request.urlopen(url, timeout=10) as resp:  # the UI's single-page app
            assert resp.status == 200 and "text/html" in resp.headers["content-type"]
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, png_height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, png_height) == (1400, max(900, height))
    assert len(png) > 20_000  # a rendered page, not a blank one
    print(f"screenshot: {tmp_path / 'freshness.png'}")
