"""The Airflow UI as the README tells users to run it: its steps under "In the Airflow UI"
start `airflow standalone` from the local stack's AIRFLOW_HOME (the README's commands,
run as written), and a real Chromium driven by Playwright signs in, switches the load DAG
on and triggers it, then triggers the backfill form with its defaults, the snapshot
form with a table chosen and the dead-letters form with replay chosen. The scheduler runs
everything (LocalExecutor; the triggerer follows the snapshot), each run must succeed,
and the lake then equals the source.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from cdclake_control.compare import compare_pipeline
from cdclake_control.watermarks import fetch_watermarks
from cdclake_local.airflow_home import API_PORT_ENV, PASSWORDS_FILE
from cdclake_local.airflow_server import api_token, healthy, log_tail, stop_airflow, stop_group
from cdclake_local.procs import processes
from cdclake_local.workload import apply_workload

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")  # Debian's; .ci/run installs it
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
README = ROOT / "README.md"
README_SECTION = "### In the Airflow UI"
README_URL = "http://127.0.0.1:8080"
PORTS = range(18600, 18700)
START_S = 180  # standalone up, every component healthy, the DAGs parsed
RUN_S = 300  # one DAG run, queued to finished
UI_MS = 30_000  # one browser step
SNAPSHOT_TABLE = "inventory.customers"
TYPED_TABLE = "inventory.products"
DAGS = ("cdclake__demo", "cdclake_backfill", "cdclake_snapshot", "cdclake_dead_letters")
# set by `local env` (or not at all) in the README's steps, whatever the tests' environment
FROM_LOCAL_ENV = ("AIRFLOW_HOME", "CDCLAKE_KAFKA_BOOTSTRAP", "CDCLAKE_SOURCE_DSN",
                  "CDCLAKE_CATALOG_URI", "CDCLAKE_WAREHOUSE", "CDCLAKE_SPARK_JARS",
                  "CDCLAKE_PIPELINES_DIR", "VIRTUAL_ENV", "CDCLAKE_KAFKA_SECURITY_PROTOCOL",
                  "CDCLAKE_KAFKA_SASL_MECHANISM", "CDCLAKE_KAFKA_USER",
                  "CDCLAKE_KAFKA_PASSWORD")  # fmt: skip


@dataclass(frozen=True)
class Airflow:
    base: str
    home: Path
    log: Path
    token: str
    password: str

    def get(self, path: str) -> dict | None:
        """GET an API path as admin; None when it does not exist (404)."""
        req = urllib.request.Request(
            self.base + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=20) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def post(self, path: str, body: dict) -> tuple[int, str]:
        """POST JSON to an API path as admin: (status, body text)."""
        req = urllib.request.Request(
            self.base + path, data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Bearer {self.token}",
                     "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=20) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def run_path(self, dag_id: str, run_id: str) -> str:
        return f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}"


def readme_commands() -> list[str]:
    """The shell commands of the README's UI steps, as written there."""
    text = README.read_text()
    assert README_SECTION in text, f"README.md has no section {README_SECTION!r}"
    section = text.split(README_SECTION, 1)[1].split("\n#", 1)[0]
    assert README_URL in section
    block = re.search(r"```bash\n(.*?)\n\s*```", section, re.S)
    assert block, f"README.md {README_SECTION}: no bash block"
    commands = [line.strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands[-1] == "airflow standalone", commands
    return commands


def free_port() -> int:
    if os.environ.get("CDCLAKE_TEST_AIRFLOW_PORT"):
        return int(os.environ["CDCLAKE_TEST_AIRFLOW_PORT"])
    for port in PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    pytest.fail(f"no free port in {PORTS.start}-{PORTS.stop - 1} for the api-server")


def wait_until(what: str, check: Callable[[], object], timeout: float, log: Path) -> object:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except OSError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s\n{log_tail(log)}")
        time.sleep(2)


@pytest.fixture(scope="module")
def airflow(stack, tmp_path_factory) -> Iterator[Airflow]:
    """The README's commands in bash, from the repository root, with the api port moved to
    a free one. The environment is the test stack's as a user who moved the stack has it
    (CDCLAKE_STATE_DIR and ports); what `local env` exports is left to it."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in FROM_LOCAL_ENV}
    env = {k: v for k, v in env.items() if not k.startswith("AIRFLOW__")}
    env[API_PORT_ENV] = str(port)
    log = tmp_path_factory.mktemp("airflow-ui") / "standalone.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-ec", "\n".join(readme_commands())], cwd=ROOT, env=env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            "airflow standalone healthy",
            lambda: proc.poll() is None and healthy(base) or proc.poll() is not None,
            START_S, log,
        )  # fmt: skip
        assert proc.poll() is None, f"the README's commands exited {proc.poll()}\n{log_tail(log)}"
        home = Path(os.environ["AIRFLOW_HOME"])
        passwords = home / PASSWORDS_FILE
        password = wait_until(
            "admin password", lambda: json.loads(passwords.read_text() or "{}").get("admin"),
            30, log,
        )  # fmt: skip
        found = Airflow(base=base, home=home, log=log, token=api_token(base, password),
                        password=password)  # fmt: skip
        wait_until(
            f"DAGs {DAGS} parsed", lambda: all(found.get(f"/api/v2/dags/{d}") for d in DAGS),
            START_S, log,
        )  # fmt: skip
        yield found
    finally:
        left = ctrl_c(proc)
        stop_group(proc)
    assert not left, f"left running after Ctrl+C and `cdclake local down`'s stop: {left}"


def ctrl_c(proc: subprocess.Popen) -> list[int]:
    """Ctrl+C in the terminal (SIGINT to the README commands' process group), then what
    `cdclake local down` does to the stack's Airflow: the processes of the group left
    after that."""
    os.killpg(proc.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=15)
    stop_airflow(Path(os.environ["AIRFLOW_HOME"]))
    return [p for p, (_, group, _) in processes().items() if group == proc.pid]


@pytest.fixture
def page(tmp_path):
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            tab.set_default_timeout(UI_MS)
            yield tab
            tab.screenshot(path=tmp_path / "last.png")
            print(f"the browser's last page: {tmp_path / 'last.png'}")
        finally:
            browser.close()


# ---- the UI, as a user clicks through it ---------------------------------------------------
def sign_in(page, airflow: Airflow) -> None:
    page.goto(airflow.base + "/")  # Airflow sends the browser to its sign-in page
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill(airflow.password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(airflow.base + "/")


def open_dag(page, airflow: Airflow, dag_id: str) -> None:
    page.goto(f"{airflow.base}/dags/{dag_id}")
    page.get_by_role("button", name="Trigger Dag").wait_for()


def switch_on(page, airflow: Airflow, dag_id: str) -> None:
    """The toggle beside the DAG's name; the API must then show it unpaused."""
    if airflow.get(f"/api/v2/dags/{dag_id}")["is_paused"]:
        page.get_by_test_id("toggle-pause").click()
    wait_until(
        f"{dag_id} switched on", lambda: not airflow.get(f"/api/v2/dags/{dag_id}")["is_paused"],
        30, airflow.log,
    )  # fmt: skip


def trigger(page, dag_id: str, *fills: Callable[[object], None]) -> str:
    """Trigger in the DAG's page, the form (filled by `fills`), Trigger; the run's id from
    the page the UI opens."""
    from playwright.sync_api import expect

    page.get_by_role("button", name="Trigger Dag").click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_role("heading", name=f"Trigger Dag - {dag_id}")).to_be_visible()
    for fill in fills:
        fill(dialog)
    button = dialog.get_by_role("button", name="Trigger", exact=True)
    expect(button).to_be_enabled()
    button.click()
    page.wait_for_url(re.compile(rf"/dags/{dag_id}/runs/[^/?#]+"))
    encoded = re.search(rf"/dags/{dag_id}/runs/([^/?#]+)", page.url).group(1)
    return urllib.parse.unquote(encoded)


def choose_table(table: str, offered: list[str]) -> Callable[[object], None]:
    """Tables: the picker must offer `offered` (every table of the pipeline); `table`
    chosen."""

    def fill(dialog) -> None:
        dialog.get_by_role("combobox", name="Select one or multiple values").click()
        options = dialog.page.get_by_role("option")
        options.first.wait_for()
        assert sorted(options.all_inner_texts()) == sorted(offered)
        dialog.page.get_by_role("option", name=table, exact=True).click()
        dialog.get_by_text("Tables", exact=True).click()  # closes the list

    return fill


def refuses_json(param: str, text: str) -> Callable[[object], None]:
    """The JSON field of the form's `param`: `text` (not JSON) typed in is refused at the
    field, in words, with Trigger disabled; then the field is emptied."""

    def fill(dialog) -> None:
        from playwright.sync_api import expect

        keyboard = dialog.page.keyboard
        dialog.locator(f"#element_{param}").click()
        keyboard.press("Control+A")
        keyboard.insert_text(text)
        # the browser's JSON parser's words, under the field
        error = dialog.locator(f"#element_{param}").locator("xpath=../..")
        expect(error.locator("[data-part=error-text]")).to_contain_text("SyntaxError")
        expect(dialog.get_by_role("button", name="Trigger", exact=True)).to_be_disabled()
        keyboard.press("Control+A")
        keyboard.press("Delete")

    return fill


def type_lines(param: str, lines: list[str]) -> Callable[[object], None]:
    """The text box of the form's `param`: `lines` typed, one per line."""

    def fill(dialog) -> None:
        dialog.locator(f"#element_{param}").fill("\n".join(lines))

    return fill


def choose(param: str, value: str) -> Callable[[object], None]:
    """The drop-down of the form's `param`: `value` chosen."""

    def fill(dialog) -> None:
        from playwright.sync_api import expect

        field = dialog.locator(f"#element_{param}")
        field.get_by_role("combobox").click()
        dialog.page.get_by_role("option", name=value, exact=True).click()
        expect(field).to_contain_text(value)

    return fill


# ---- what the scheduler did ----------------------------------------------------------------
def task_failure(path: Path, keep: int = 30) -> str:
    """The last `keep` lines of a task's log that are not frames of a JVM stack trace, each
    line's event alone: the error a long Java trace would push out of a log's tail."""
    events = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            line = json.loads(line).get("event", line)
        except (ValueError, AttributeError):
            pass
        if not re.match(r"\s*(at |\.\.\. \d+ more)", str(line)):
            events.append(str(line)[:500])
    return f"--- {path} (last {keep} lines, JVM frames left out)\n" + "\n".join(events[-keep:])


def run_report(airflow: Airflow, dag_id: str, run_id: str) -> str:
    """Task states of a run and the end of the log of each task that did not succeed."""
    try:
        tis = airflow.get(airflow.run_path(dag_id, run_id) + "/taskInstances") or {}
    except OSError as exc:
        tis = {"task_instances": [], "error": f"task states unavailable: {exc}"}
    lines, logs = [], []
    for ti in tis.get("task_instances", []):
        lines.append(f"{ti['task_id']}: {ti['state']} (try {ti['try_number']})")
        if ti["state"] not in ("success", "skipped"):
            folder = airflow.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
            logs += [task_failure(p) for p in sorted(folder.glob(f"task_id={ti['task_id']}/*"))]
    head = f"{dag_id} {run_id}: {tis.get('error', '')}"
    return "\n".join([head, *lines, *logs, log_tail(airflow.log, 30)])


def wait_for_run(airflow: Airflow, dag_id: str, run_id: str) -> dict:
    """The run once finished; fails naming its tasks' states and logs unless it succeeded."""
    deadline = time.monotonic() + RUN_S
    run = None
    while time.monotonic() < deadline:
        try:
            run = airflow.get(airflow.run_path(dag_id, run_id))  # None until created
        except OSError:  # a busy api-server: ask again until the deadline
            pass
        if run is not None and run["state"] in ("success", "failed"):
            break
        time.sleep(3)
    state = run["state"] if run else "not created"
    if state != "success":
        finished = state in ("failed", "success")
        why = f"run {state}" if finished else f"run {state} after {RUN_S}s"
        raise AssertionError(f"{why}\n{run_report(airflow, dag_id, run_id)}")
    return run


def wait_until_idle(airflow: Airflow, dag_id: str) -> list[dict]:
    """Every run of the DAG finished (switching it on schedules one); all must succeed."""

    def finished() -> list[dict] | None:
        runs = airflow.get(f"/api/v2/dags/{dag_id}/dagRuns")["dag_runs"]
        return None if any(r["state"] in ("queued", "running") for r in runs) else runs or None

    runs = wait_until(f"{dag_id}: runs finished", finished, RUN_S, airflow.log)
    failed = [r["dag_run_id"] for r in runs if r["state"] != "success"]
    assert not failed, run_report(airflow, dag_id, failed[0])
    return runs


def xcom(airflow: Airflow, dag_id: str, run_id: str, task_id: str):
    path = f"{airflow.run_path(dag_id, run_id)}/taskInstances/{task_id}/xcomEntries/return_value"
    entry = airflow.get(path + "?deserialize=true")
    value = entry["value"] if entry else None
    return json.loads(value) if isinstance(value, str) and value[:1] in "{[" else value


def task_log(airflow: Airflow, dag_id: str, run_id: str, task_id: str) -> list[str]:
    """A task's log lines in order, as the UI shows them (each event's text)."""
    folder = airflow.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    events = []
    for path in sorted(folder.glob("*")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                events.append(str(json.loads(line).get("event", "")))
            except (ValueError, AttributeError):
                events.append(line)
    return events


def task_output(airflow: Airflow, dag_id: str, run_id: str, task_id: str) -> list[dict]:
    """The JSON objects a task printed, from its log."""
    found = []
    for event in task_log(airflow, dag_id, run_id, task_id):
        start = event.find('{"')
        if start >= 0:
            try:
                found.append(json.loads(event[start:]))
            except ValueError:
                continue
    return found


def spark_info_lines(lines: list[str]) -> list[str]:
    """Spark's own INFO lines, but for the SparkContext's first ones (before its level)."""
    return [x for x in lines if re.search(r"\d\d/\d\d/\d\d [\d:]+ INFO (?!SparkContext: )", x)]


def high_watermarks(pipeline) -> dict[str, int]:
    topics = [pipeline.topic_for(t) for t in pipeline.tables]
    marks = fetch_watermarks(pipeline.kafka, topics)
    return {f"{topic}/{part}": m.high for (topic, part), m in marks.items()}


def assert_lake_equals_source(pipeline, dsn: str) -> None:
    results = compare_pipeline(pipeline, dsn)
    diffs = [(r.source, r.missing[:3], r.extra[:3]) for r in results if not r.equal]
    assert not diffs
    assert sum(len(r.source_rows) for r in results) > 20


# ---- the README's steps --------------------------------------------------------------------
def test_readme_ui_steps_load_backfill_and_snapshot_through_the_scheduler(
    stack, pipeline, airflow, page
):
    assert airflow.get("/api/v2/importErrors")["import_errors"] == []
    apply_workload(stack.source_dsn)  # inserts, updates, deletes, a primary-key change
    stack.wait_for_capture()

    # 2. sign in; 3. the load DAG switched on and triggered
    sign_in(page, airflow)
    open_dag(page, airflow, "cdclake__demo")
    switch_on(page, airflow, "cdclake__demo")
    run_id = trigger(page, "cdclake__demo")
    assert wait_for_run(airflow, "cdclake__demo", run_id)["run_type"] == "manual"
    wait_until_idle(airflow, "cdclake__demo")
    assert_lake_equals_source(pipeline, stack.source_dsn)
    # Airflow's date-range backfill, which its trigger dialog offers any scheduled DAG, is
    # refused: a run loads offsets (the cdclake_backfill form replays them)
    status, said = airflow.post("/api/v2/backfills", {
        "dag_id": "cdclake__demo", "from_date": "2026-01-01T00:00:00Z",
        "to_date": "2026-01-02T00:00:00Z",
    })  # fmt: skip
    assert status >= 400 and "does not allow backfill runs" in said, (status, said)
    # the tasks' logs lead with what happened, without Spark's INFO lines
    loaded = task_log(airflow, "cdclake__demo", run_id, "load")
    assert spark_info_lines(loaded) == [] and not [x for x in loaded if "INFO py4j" in x]
    said = task_log(airflow, "cdclake__demo", run_id, "report")
    lines = [x for x in said if x.startswith(f"{pipeline.catalog.name}.{pipeline.namespace}.")]
    assert len(lines) == len(pipeline.tables) and said.index(lines[0]) < min(
        i for i, x in enumerate(said) if x.startswith('{"')
    ), said

    # 4. the backfill form's defaults: every table of demo, earliest to latest
    apply_workload(stack.source_dsn)
    stack.wait_for_capture()
    marks = high_watermarks(pipeline)
    open_dag(page, airflow, "cdclake_backfill")
    run_id = trigger(page, "cdclake_backfill", refuses_json("start_offsets", '{"0": ten}'))
    wait_for_run(airflow, "cdclake_backfill", run_id)
    plan = xcom(airflow, "cdclake_backfill", run_id, "plan")
    assert plan["mode"] == "replay", plan
    ranges = [r for p in json.loads(plan["plans_json"]) for r in p["ranges"]]
    assert {f"{r['topic']}/{r['partition']}": r["end"] for r in ranges} == marks
    assert min(r["start"] for r in ranges) == 0
    wait_until_idle(airflow, "cdclake__demo")
    assert_lake_equals_source(pipeline, stack.source_dsn)

    # 5. the snapshot form with a table chosen; its run triggers the load DAG
    topic = pipeline.topic_for(pipeline.table_named(SNAPSHOT_TABLE))
    before = sum(m.high for m in fetch_watermarks(pipeline.kafka, [topic]).values())
    open_dag(page, airflow, "cdclake_snapshot")
    offered = [t.source for t in pipeline.tables]
    # a table the picker does not offer is typed under Other tables
    run_id = trigger(page, "cdclake_snapshot", choose_table(SNAPSHOT_TABLE, offered),
                     type_lines("other_tables", [TYPED_TABLE]))  # fmt: skip
    wait_for_run(airflow, "cdclake_snapshot", run_id)
    sent = xcom(airflow, "cdclake_snapshot", run_id, "send_signal")
    assert sent["tables"] == [SNAPSHOT_TABLE, TYPED_TABLE], sent
    done = xcom(airflow, "cdclake_snapshot", run_id, "wait_for_snapshot")
    assert done["status"] == "COMPLETED", done
    after = sum(m.high for m in fetch_watermarks(pipeline.kafka, [topic]).values())
    with psycopg.connect(stack.source_dsn) as conn:
        rows = conn.execute(f"select count(*) from {SNAPSHOT_TABLE}").fetchone()[0]
    assert after - before >= rows > 0  # every row read again by the snapshot
    wait_for_run(airflow, "cdclake__demo", f"after-{run_id}")
    wait_until_idle(airflow, "cdclake__demo")
    assert_lake_equals_source(pipeline, stack.source_dsn)

    # 6. the dead-letters form, its action switched to replay: demo set nothing aside
    open_dag(page, airflow, "cdclake_dead_letters")
    run_id = trigger(page, "cdclake_dead_letters", choose("action", "replay"))
    wait_for_run(airflow, "cdclake_dead_letters", run_id)
    said = task_log(airflow, "cdclake_dead_letters", run_id, "dead_letters__demo")
    answer = said.index("0 of 0 pending dead letter(s) for demo replayed")
    assert spark_info_lines(said[:answer]) == []
    reports = [o for o in task_output(airflow, "cdclake_dead_letters", run_id,
                                      "dead_letters__demo") if "replayed" in o]  # fmt: skip
    assert [(r["pipeline"], r["pending"], r["replayed"]) for r in reports] == [("demo", 0, 0)]

    # 7. Browse → Lake freshness: the page in the UI's frame; its link to the load DAG
    # opens the DAG's page in the whole window
    page.goto(airflow.base + "/plugin/cdclake-freshness")
    frame = page.frame_locator("iframe[title='Lake freshness']")
    frame.get_by_role("link", name="cdclake__demo", exact=True).click()
    page.wait_for_url(re.compile(r"/dags/cdclake__demo/?$"))
