"""cdclake_backfill (replay, rebuild) and cdclake_snapshot run by Airflow (dag.test) on the
local stack, against a pipeline of their own."""

from __future__ import annotations

import os
import uuid

import psycopg
import pytest
import yaml
from cdclake.iceberg.catalog import load_catalog
from cdclake.offsets import SUMMARY_BATCH
from cdclake.pipeline_file import load_pipeline
from cdclake_control.catalog import table_state
from cdclake_control.watermarks import fetch_watermarks

from tests.conftest import DEMO_PIPELINE
from tests.e2e.helpers import asset_events, run_dag, task_states, xcom_of
from tests.integration.helpers import assert_lake_equals_source, concurrent_writes, load_all

pytestmark = pytest.mark.e2e

N = uuid.uuid4().hex[:6]
BF = f"inventory.bf_{N}"
SNAP = f"inventory.snap_{N}"
NAME = f"e2e_{N}"  # BF, at most 150 records a batch
SNAP_NAME = f"e2e_snap_{N}"
PAT_NAME = f"e2e_pat_{N}"  # its tables are found by a pattern
PAT_TABLES = [f"inventory.pat_{N}_a", f"inventory.pat_{N}_b"]
DL = f"inventory.dl_{N}"
DL_NAME = f"e2e_dl_{N}"  # DL, its bad records set aside


def sql(dsn: str, *statements, params=None):
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s, params)


@pytest.fixture(scope="module")
def pipelines(stack, tmp_path_factory):
    """Two pipelines with fresh tables, in a pipelines directory the DAG files read."""
    directory = tmp_path_factory.mktemp("pipelines")
    for name, tables, cap in (
        (NAME, [BF], 150), (SNAP_NAME, [SNAP], 100_000), (PAT_NAME, [f"inventory.pat_{N}_*"], 100),
        (DL_NAME, [DL], 100),
    ):  # fmt: skip
        raw = yaml.safe_load(DEMO_PIPELINE.read_text())
        raw.update(name=name, namespace=name, tables=tables, max_records_per_batch=cap)
        if name == DL_NAME:
            raw["on_error"] = "dead_letter"
        raw["catalog"]["warehouse"] = "${CDCLAKE_WAREHOUSE}"
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(raw))
    sql(
        stack.source_dsn,
        f"create table {BF} (id int primary key, v int, note text)",
        f"insert into {BF} select i, i, 'first' from generate_series(1, 200) i",
        f"update {BF} set v = v + 1000, note = 'second' where id % 3 = 0",
        f"delete from {BF} where id % 7 = 0",
        f"create table {SNAP} (id int primary key, v int, note text)",
        f"insert into {SNAP} select i, i, 'start' from generate_series(1, 300) i",
        *(f"create table {t} (id int primary key)" for t in PAT_TABLES),
        *(f"insert into {t} values (1)" for t in PAT_TABLES),
        f"create table {DL} (id int primary key, v int)",
        f"insert into {DL} values (1, 10)",
    )
    old = os.environ.get("CDCLAKE_PIPELINES_DIR")
    os.environ["CDCLAKE_PIPELINES_DIR"] = str(directory)
    yield {name: load_pipeline(directory / f"{name}.yaml") for name in (NAME, SNAP_NAME, DL_NAME)}
    if old is None:
        os.environ.pop("CDCLAKE_PIPELINES_DIR")
    else:
        os.environ["CDCLAKE_PIPELINES_DIR"] = old


def offsets(pipeline, source: str) -> dict:
    table = pipeline.table_named(source)
    return table_state(load_catalog(pipeline.catalog), pipeline, table).offsets


def high(pipeline, source: str) -> dict:
    topic = pipeline.topic_for(pipeline.table_named(source))
    return {tp: m.high for tp, m in fetch_watermarks(pipeline.kafka, [topic]).items()}


def test_backfill_replay_repairs_without_regressing_and_rebuild_reloads(stack, spark, pipelines):
    e2e = pipelines[NAME]
    load_all(stack, spark, e2e, "e2e-bf")  # batches of at most 150 records
    assert_lake_equals_source(e2e, stack.source_dsn)
    target = e2e.qualified_target(e2e.table_named(BF))
    committed = offsets(e2e, BF)
    assert committed == high(e2e, BF)

    # rows lost from the lake are restored by a replay of the first 100 records; the
    # rows changed after those records keep their newer values
    spark.sql(f"DELETE FROM {target} WHERE id <= 20")
    run = run_dag("cdclake_backfill", {
        "pipeline": NAME, "tables": [BF], "mode": "replay", "start": "earliest",
        "end": "offsets", "end_offsets": {"0": 100},
    })  # fmt: skip
    plan = xcom_of(run, "plan")
    assert plan["mode"] == "replay" and plan["batches"] >= 2  # split by the cap
    assert task_states(run)["load__" + NAME] == "success"
    assert_lake_equals_source(e2e, stack.source_dsn)
    assert offsets(e2e, BF) == committed  # never moved backwards
    assert {k: e["records"] for k, e in asset_events(run).items()} == {target: plan["records"]}

    # rebuild: the table is dropped and reloaded from offset 0; new history, same rows
    sql(stack.source_dsn, f"update {BF} set note = 'third' where id = 1")
    stack.wait_for_capture()
    run = run_dag("cdclake_backfill", {"pipeline": NAME, "tables": [f"bf_{N}"],
                                       "mode": "rebuild", "start": "earliest"})  # fmt: skip
    assert_lake_equals_source(e2e, stack.source_dsn)
    ice = load_catalog(e2e.catalog).load_table((NAME, f"bf_{N}"))
    history = [s.summary.additional_properties.get(SUMMARY_BATCH, "") for s in ice.snapshots()]
    assert history and all(b.startswith(f"cdclake_backfill/{run.run_id}/") for b in history)
    assert offsets(e2e, BF) == high(e2e, BF)
    assert set(asset_events(run)) == {target}

    # invalid input fails the first task, and nothing is loaded
    run = run_dag("cdclake_backfill", {"pipeline": NAME, "tables": ["inventory.nope"]},
                  state="failed")  # fmt: skip
    states = task_states(run)
    assert states["plan"] == "failed" and states["load__" + NAME] != "success"
    assert asset_events(run) == {}


def test_a_backfill_emits_asset_events_for_the_tables_it_changed_only(stack, pipelines):
    """A backfill of one of a pipeline's two tables (found by a pattern: their assets are
    created by the events) emits an event for that table and none for the other."""
    stack.wait_for_capture()
    run = run_dag("cdclake_backfill", {
        "pipeline": PAT_NAME, "tables": [PAT_TABLES[0]], "mode": "replay",
        "start": "earliest", "end": "latest",
    })  # fmt: skip
    plan = xcom_of(run, "plan")
    assert plan["records"] >= 1
    events = asset_events(run)
    assert {k: e["records"] for k, e in events.items()} == {
        f"lake.{PAT_NAME}.{PAT_TABLES[0].split('.')[1]}": plan["records"]
    }


def test_snapshot_signal_with_filter_while_the_table_is_written(stack, spark, pipelines):
    e2e = pipelines[SNAP_NAME]
    load_all(stack, spark, e2e, "e2e-snap-0")
    with concurrent_writes(stack.source_dsn, SNAP, 151, 350, seed=5):  # ids <= 150: snapshot only
        # an OR that Debezium's chunk query must not unbind
        run = run_dag("cdclake_snapshot", {
            "pipeline": SNAP_NAME, "action": "execute", "tables": [SNAP],
            "filters": {SNAP: "id <= 60 or id between 90 and 100"},
            "timeout_minutes": 5, "trigger_load": True,
        })  # fmt: skip
    sent = xcom_of(run, "send_signal")
    assert sent["signal_id"].startswith("cdclake-cdclake_snapshot-")  # traceable to the run
    progress = xcom_of(run, "wait_for_snapshot")
    assert progress["status"] == "COMPLETED"
    assert progress["rows_scanned"] == {SNAP: 71}
    with psycopg.connect(stack.source_dsn) as conn:
        data = conn.execute(
            "select data from public.debezium_signal where id = %s", (sent["signal_id"],)
        ).fetchone()[0]
    assert '"additional-conditions"' in data and '"additional-condition"' not in data
    assert task_states(run)["trigger_load"] == "success"  # the pipeline's load was queued

    load_all(stack, spark, e2e, "e2e-snap-1")
    assert_lake_equals_source(e2e, stack.source_dsn)
    lake = load_catalog(e2e.catalog).load_table((SNAP_NAME, f"snap_{N}")).scan().to_arrow()
    reads = {i for i, op in zip(lake["id"].to_pylist(), lake["_cdc_op"].to_pylist(), strict=True)
             if op == "r"}  # fmt: skip
    assert reads == {*range(1, 61), *range(90, 101)}  # the filter applied; the reads loaded


@pytest.mark.parametrize(
    "conf",
    [
        {"tables": ["inventory.nope"]},
        {"filters": {SNAP: "id < 5; drop table x"}},
        {"surrogate_key": "nope"},
        {"tables": [], "other_tables": ["inventory.nope", ""]},  # typed, not a table of it
        {"filters": {SNAP: "pg_sleep(1) is null"}},  # volatile: never run in the source
        {"filters": {SNAP: f"id < nextval('{SNAP}_seq')"}},
        {"filters": {SNAP: "id < 5 and random() < 0.5"}, "channel": "kafka"},  # nor the topic
    ],
)  # fmt: skip
def test_malformed_snapshot_requests_fail_the_first_task_writing_nothing(stack, pipelines, conf):
    before = signals_sent(stack, pipelines[SNAP_NAME])
    full = {"pipeline": SNAP_NAME, "action": "execute", "tables": [SNAP], "trigger_load": False,
            **conf}  # fmt: skip
    run = run_dag("cdclake_snapshot", full, state="failed")
    assert task_states(run)["send_signal"] == "failed"
    assert signals_sent(stack, pipelines[SNAP_NAME]) == before


def signals_sent(stack, pipeline) -> tuple[int, int]:
    """Rows in the signal table, records on the Kafka signal topic."""
    with psycopg.connect(stack.source_dsn) as conn:
        rows = conn.execute("select count(*) from public.debezium_signal").fetchone()[0]
    topic = pipeline.source.signal_topic
    return rows, sum(m.high for m in fetch_watermarks(pipeline.kafka, [topic]).values())


@pytest.mark.parametrize("text", [f'"{SNAP}": "id < 5"', "{" + f'"{SNAP}": id < 5' + "}"],
                         ids=["not-an-object", "not-json"])  # fmt: skip
def test_a_filters_box_that_is_no_json_object_is_refused_at_trigger(stack, pipelines, text):
    """Text, JSON or not, is refused: the field takes an object (the UI's JSON editor
    refuses text that does not parse)."""
    from airflow.sdk.definitions.param import ParamValidationError

    before = signals_sent(stack, pipelines[SNAP_NAME])
    with pytest.raises(ParamValidationError, match="filters"):
        run_dag("cdclake_snapshot", {"pipeline": SNAP_NAME, "tables": [SNAP], "filters": text})
    assert signals_sent(stack, pipelines[SNAP_NAME]) == before


def test_the_tables_picker_offers_the_tables_a_pattern_found(stack, pipelines):
    from airflow.dag_processing.dagbag import DagBag

    from tests.conftest import ROOT

    stack.wait_for_capture()  # their topics exist
    bag = DagBag(dag_folder=str(ROOT / "dags"))
    for dag_id in ("cdclake_snapshot", "cdclake_backfill"):
        offered = bag.dags[dag_id].params.get_param("tables").schema["examples"]
        assert set(PAT_TABLES) | {BF, SNAP} <= set(offered), dag_id


def test_the_dead_letters_form_lists_and_replays_set_aside_records(stack, spark, pipelines):
    """A change that does not fit its lake column is set aside; once the column is
    dropped (as the error says), the form's replay loads it and nothing stays pending."""
    from cdclake.redrive import list_dead_letters

    dl = pipelines[DL_NAME]
    load_all(stack, spark, dl, f"dl-{N}-a")
    sql(stack.source_dsn, f"alter table {DL} alter column v type text using v::text",
        f"update {DL} set v = 'ten' where id = 1")  # fmt: skip
    load_all(stack, spark, dl, f"dl-{N}-b")
    [pending] = list_dead_letters(spark, dl)
    assert "column 'v' is int in the lake" in pending["error"]
    run = run_dag("cdclake_dead_letters", {"pipeline": DL_NAME, "action": "list"})
    assert task_states(run)[f"dead_letters__{DL_NAME}"] == "success"
    target = dl.qualified_target(dl.tables[0])
    spark.sql(f"ALTER TABLE {target} DROP COLUMN v")
    run = run_dag("cdclake_dead_letters", {"pipeline": DL_NAME, "action": "replay",
                                           "table": DL, "since": "2020-01-01"})  # fmt: skip
    assert task_states(run)[f"dead_letters__{DL_NAME}"] == "success"
    assert list_dead_letters(spark, dl) == []
    assert_lake_equals_source(dl, stack.source_dsn)
