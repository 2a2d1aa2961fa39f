"""Malformed snapshot requests are refused, naming what is wrong, with nothing written to
the signal table: checked against the real source database and Kafka."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from cdclake_control.signals import SignalError, follow_snapshot, parse_request, submit

from tests.integration.helpers import assert_lake_equals_source, load_all, make_pipeline

N = uuid.uuid4().hex[:6]
T = f"inventory.sig_{N}"
OTHER = f"inventory.sig_other_{N}"


@pytest.fixture(scope="module")
def sig_pipeline(stack, tmp_path_factory):
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {T} (id int primary key, code text, v int)")
        conn.execute(f"create table {OTHER} (id int primary key, v int)")
    # no Kafka signal topic configured: the kafka channel must be refused
    source = {"signal_table": "public.debezium_signal"}
    return make_pipeline(tmp_path_factory.mktemp("sig"), f"it_sig_{N}", [T, OTHER], source=source)


def signals(dsn: str) -> int:
    """Signals sent by clients: Debezium itself adds window rows while any snapshot runs."""
    with psycopg.connect(dsn) as conn:
        return conn.execute("select count(*) from public.debezium_signal "
                            "where type not like 'snapshot-window-%'").fetchone()[0]  # fmt: skip


MALFORMED = [
    ({"action": "snapshot-everything", "tables": [T]}, "action"),
    ({"action": "execute", "tables": [T], "type": "eventual"}, "type"),
    ({"action": "execute", "tables": []}, "at least one table"),
    ({"action": "execute", "tables": ["inventory.customers"]}, "not captured"),
    ({"action": "execute", "tables": ["sig_" + N]}, "<schema>.<table>"),
    ({"action": "execute", "tables": [T + "; drop table x"]}, "plain names"),
    ({"action": "execute", "tables": ['inventory."weird.name"']}, "plain names"),
    ({"action": "execute", "tables": [T], "filters": {T: "id > 1; delete from t"}}, "separators"),
    ({"action": "execute", "tables": [T], "filters": {T: "id > 1 -- all"}}, "comments"),
    ({"action": "execute", "tables": [T], "filters": {T: "id > 1 /* x */"}}, "comments"),
    ({"action": "execute", "tables": [T], "filters": {T: "   "}}, "empty"),
    ({"action": "execute", "tables": [T], "filters": {OTHER: "id > 1"}}, "not being snapshotted"),
    (
        {"action": "execute", "tables": [T], "filters": {T: "nosuchcol = 1"}},
        "not a valid condition",
    ),
    ({"action": "execute", "tables": [T], "filters": {T: "id >"}}, "not a valid condition"),
    ({"action": "execute", "tables": [T], "filters": {T: 5}}, "must be a string"),
    # functions are checked against the source's pg_proc: only immutable ones may be called
    (
        {"action": "execute", "tables": [T], "filters": {T: f"id = nextval('{T}_seq')"}},
        r"nextval\(\), which PostgreSQL marks volatile",
    ),
    (
        {"action": "execute", "tables": [T], "filters": {T: "lo_from_bytea(0, 'x') > 0"}},
        r"lo_from_bytea\(\), which PostgreSQL marks volatile",
    ),
    (
        {"action": "execute", "tables": [T], "filters": {T: "pg_sleep(5) is null"}},
        r"pg_sleep\(\), which PostgreSQL marks volatile",
    ),
    (
        {"action": "execute", "tables": [T], "filters": {T: "v < random()"}},
        r"random\(\), which PostgreSQL marks volatile",
    ),
    (
        {"action": "execute", "tables": [T], "filters": {T: "v > extract(epoch from now())"}},
        r"extract\(\), which PostgreSQL marks stable",
    ),
    (
        {"action": "execute", "tables": [T], "filters": {T: "not_a_function(v) = 1"}},
        r"not_a_function\(\), which is not a function",
    ),
    ({"action": "execute", "tables": [T], "filters": {T: "id in (select 1)"}}, "subquery"),
    # the signal table's data column is varchar(2048): a clear error, not a failed INSERT
    (
        {"action": "execute", "tables": [T], "filters": {T: "id > 0 and " * 220 + "true"}},
        r"holds \(varchar\(2048\)\)",
    ),
    ({"action": "execute", "tables": [T, OTHER], "surrogate_key": "code"}, "not a column"),
    ({"action": "execute", "tables": [T], "surrogate_key": "code; x"}, "not a column name"),
    ({"action": "pause", "tables": [T]}, "give no tables"),
    ({"action": "stop", "tables": [T], "type": "blocking"}, "incremental snapshots only"),
    ({"action": "stop", "tables": [T], "filters": {T: "id > 1"}}, "execute-snapshot only"),
    ({"action": "execute", "tables": [T], "channel": "kafka"}, "signal_topic"),
    ({"action": "execute", "tables": [T], "channel": "carrier-pigeon"}, "channel"),
]


@pytest.mark.parametrize(("form", "message"), MALFORMED)
def test_malformed_request_is_refused_and_nothing_is_written(stack, sig_pipeline, form, message):
    before = signals(stack.source_dsn)
    form = dict(form)
    channel = form.pop("channel", "source")
    with pytest.raises(SignalError, match=message):
        request = parse_request(**form)
        submit(sig_pipeline, stack.source_dsn, request, channel=channel, origin="test")
    assert signals(stack.source_dsn) == before


def test_missing_source_table_is_refused(stack, tmp_path):
    gone = make_pipeline(tmp_path, f"it_sig_gone_{N}", ["inventory.never_created_" + N])
    with pytest.raises(SignalError, match="does not exist in the source"):
        submit(gone, stack.source_dsn, parse_request("execute", [gone.tables[0].source]))


def test_a_valid_request_is_written_with_bound_parameters(stack, sig_pipeline):
    tricky = "code = 'it''s' or code is null"  # quotes survive: no string building
    request = parse_request("execute", [T], filters={T: tricky}, surrogate_key="id")
    sent = submit(sig_pipeline, stack.source_dsn, request, origin="dag-x-run/1")
    with psycopg.connect(stack.source_dsn) as conn:
        kind, data = conn.execute(
            "select type, data from public.debezium_signal where id = %s", (sent["signal_id"],)
        ).fetchone()
    assert kind == "execute-snapshot"
    assert sent["signal_id"].startswith("cdclake-dag-x-run-1-") and len(sent["signal_id"]) <= 64
    import json

    doc = json.loads(data)
    assert doc["additional-conditions"] == [{"data-collection": T, "filter": f"({tricky})"}]
    assert "additional-condition" not in doc and doc["surrogate-key"] == "id"
    assert doc["data-collections"] == [T.replace(".", r"\.")]


def test_signal_ids_fit_a_signal_table_whose_id_holds_42(stack, sig_pipeline, tmp_path):
    """Debezium's documentation creates the signal table with id varchar(42)."""
    import dataclasses

    short, too_short = f"public.sig42_{N}", f"public.sig40_{N}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        for table, chars in ((short, 42), (too_short, 40)):
            conn.execute(f"create table {table} (id varchar({chars}) primary key, "
                         "type varchar(32) not null, data varchar(2048))")  # fmt: skip
    request = parse_request("execute", [T], filters={T: "id > 1"})
    for table in (short, too_short):
        pipeline = dataclasses.replace(
            sig_pipeline, source=dataclasses.replace(sig_pipeline.source, signal_table=table)
        )
        if table == too_short:
            with pytest.raises(SignalError, match="holds 40 characters; Debezium writes ids of 42"):
                submit(pipeline, stack.source_dsn, request, origin="cdclake_snapshot-manual__x")
            continue
        sent = submit(pipeline, stack.source_dsn, request, origin="cdclake_snapshot-manual__x")
        assert len(sent["signal_id"]) == 42
        with psycopg.connect(stack.source_dsn) as conn:
            assert conn.execute(f"select id from {table}").fetchall() == [(sent["signal_id"],)]


@pytest.mark.parametrize("channel", ["source", "kafka"])
def test_the_cli_refuses_a_filter_that_is_not_read_only(
    stack, sig_pipeline, tmp_path, capsys, channel
):
    from cdclake_control.cli import main

    pipeline = make_pipeline(tmp_path, f"it_sig_cli_{N}", [T])  # T, with a Kafka signal topic
    before = signals(stack.source_dsn)
    code = main(["snapshot", "--pipeline", str(pipeline.path), "--table", T, "--filter",
                 f"{T}=id > 0 or lo_from_bytea(0, 'x') > 0", "--source-dsn", stack.source_dsn,
                 "--channel", channel, "--no-follow"])  # fmt: skip
    assert code == 2
    message = capsys.readouterr().err
    assert "lo_from_bytea(), which PostgreSQL marks volatile" in message, message
    assert signals(stack.source_dsn) == before


def test_a_filter_that_is_not_read_only_is_not_sent_to_the_kafka_channel(stack, tmp_path):
    """The Kafka signal channel goes through the same checks: nothing reaches the topic."""
    from cdclake_control.watermarks import fetch_watermarks

    pipeline = make_pipeline(tmp_path, f"it_sig_kafka_{N}", [T])
    topic = pipeline.source.signal_topic

    def records() -> int:
        return sum(m.high for m in fetch_watermarks(pipeline.kafka, [topic]).values())

    before = records()
    for condition in ("pg_sleep(1) is null", "id > 0 and lower(code) = 'x' or now() > now()"):
        request = parse_request("execute", [T], filters={T: condition})
        with pytest.raises(SignalError, match="marks"):
            submit(pipeline, stack.source_dsn, request, channel="kafka", origin="test")
    assert records() == before


def test_kafka_channel_and_blocking_snapshot_complete_and_load(stack, spark, tmp_path):
    """The Kafka signal channel (key = topic prefix) runs an incremental snapshot; a blocking
    snapshot is followed by its own notifications; the lake then equals the source."""
    t = f"inventory.sig_blk_{N}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {t} (id int primary key, v text)")
        conn.execute(f"insert into {t} select i, 'v' || i from generate_series(1, 50) i")
    pipeline = make_pipeline(tmp_path, f"it_sig_blk_{N}", [t])
    assert pipeline.source.signal_topic
    load_all(stack, spark, pipeline, "blk-0")

    def run(request, channel):
        sent = submit(pipeline, stack.source_dsn, request, channel=channel, origin="test")
        start = {int(p): o for p, o in sent["notification_offsets"].items()}
        return follow_snapshot(pipeline.kafka, pipeline.notification_topic, sent["signal_id"],
                               300, start, sent["blocking"])  # fmt: skip

    progress = run(parse_request("execute", [t], filters={t: "id > 40"}), "kafka")
    assert progress.status == "COMPLETED" and progress.rows_scanned == {t: 10}
    progress = run(parse_request("execute", [t], type="blocking"), "source")
    assert progress.status == "COMPLETED" and progress.rows_scanned == {t: 50}
    load_all(stack, spark, pipeline, "blk-1")
    assert_lake_equals_source(pipeline, stack.source_dsn)
    ops = spark.table(pipeline.qualified_target(pipeline.tables[0])).groupBy("_cdc_op").count()
    assert {r["_cdc_op"]: r["count"] for r in ops.collect()} == {"r": 50}


def test_a_filter_that_would_cost_the_source_too_much_is_refused(stack, tmp_path):
    """A filter's cost is measured on the table before it is sent: a costly expression per
    row is refused over `source.filter_max_seconds`; the same computed once while planning
    costs little on this table and passes."""
    from cdclake_control.signals import check_source

    table = f"inventory.sig_cost_{N}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, code text)")
        conn.execute(f"insert into {table} select i, 'c' || i from generate_series(1, 5000) i")
        conn.execute(f"analyze {table}")
    source = {"signal_table": "public.debezium_signal", "filter_max_seconds": 5}
    pipeline = make_pipeline(tmp_path, f"it_sig_cost_{N}", [table], source=source)
    before = signals(stack.source_dsn)
    costly = "md5(repeat(code, 1000000)) <> ''"  # ~5 MB hashed for each row
    with pytest.raises(SignalError, match=r"would cost the source database about [\d,]+ s .*"
                                          r"over source.filter_max_seconds \(5 s\)"):  # fmt: skip
        submit(pipeline, stack.source_dsn, parse_request("execute", [table],
                                                         filters={table: costly}))  # fmt: skip
    assert signals(stack.source_dsn) == before
    once = parse_request("execute", [table], filters={table: "md5(repeat('x', 1000000)) <> ''"})
    assert check_source(stack.source_dsn, pipeline.source.signal_table, once,
                        filter_max_seconds=5) > 0  # fmt: skip
