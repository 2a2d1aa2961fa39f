"""Dead letters replayed through the command line, as users run it: a source column
changes type, its changes are set aside (they do not fit the lake column), the lake
column is dropped as the error says, a newer change loads, and `cdclake dead-letters
replay` applies the set-aside changes: the newer row is not regressed, the lake equals
the source, the dead letters are marked replayed, and a second replay finds nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import psycopg
import pytest

from tests.conftest import ROOT
from tests.integration.helpers import assert_lake_equals_source, load_all, make_pipeline

pytestmark = pytest.mark.integration


def dead_letters(pipeline_file, action: str, *args: str):
    done = subprocess.run(
        [sys.executable, "-m", "cdclake", "dead-letters", action, "--pipeline",
         str(pipeline_file), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout if action == "list" and "--json" not in args else json.loads(done.stdout)


def test_set_aside_changes_are_replayed_once_the_lake_takes_them(stack, spark, tmp_path):
    n = uuid.uuid4().hex[:6]
    table, name = f"inventory.retype_{n}", f"it_replay_{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, v int)")
        conn.execute(f"insert into {table} values (1, 10), (3, 30)")
    pipeline = make_pipeline(tmp_path, name, [table], on_error="dead_letter")
    path = tmp_path / f"{name}.yaml"
    load_all(stack, spark, pipeline, f"replay-{n}-a")
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"alter table {table} alter column v type text using v::text")
        conn.execute(f"update {table} set v = 'ten' where id = 1")
        conn.execute(f"insert into {table} values (2, 'two')")
    load_all(stack, spark, pipeline, f"replay-{n}-b")
    head, *pending = dead_letters(path, "list").splitlines()  # the answer in words
    topic = pipeline.topic_for(pipeline.tables[0])
    assert head == f"2 pending dead letters for {name} ({topic}: 2)"
    assert [line.split(": ", 1)[1][:40] for line in pending] == [
        "column 'v' is int in the lake but string"
    ] * 2
    target = pipeline.qualified_target(pipeline.tables[0])
    spark.sql(f"ALTER TABLE {target} DROP COLUMN v")  # what the error says to do
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"update {table} set v = 'latest' where id = 1")
    load_all(stack, spark, pipeline, f"replay-{n}-c")
    offsets = spark.sql(f"SELECT summary FROM {target}.snapshots ORDER BY committed_at DESC "
                        "LIMIT 1").first()[0]  # fmt: skip

    report = dead_letters(path, "replay", "--table", table)
    assert (report["pending"], report["replayed"]) == (2, 2), report
    spark.catalog.refreshTable(target)
    rows = {r.id: r.v for r in spark.table(target).collect()}
    assert rows == {1: "latest", 2: "two", 3: None}, rows  # 3's v was dropped with the column
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:  # as the source has it
        conn.execute(f"update {table} set v = v")
    load_all(stack, spark, pipeline, f"replay-{n}-d")
    assert_lake_equals_source(pipeline, stack.source_dsn)
    summary = spark.sql(f"SELECT summary FROM {target}.snapshots WHERE summary['cdclake.batch-id'] "
                        f"= '{report['batch_id']}'").first()[0]  # fmt: skip
    assert {k: v for k, v in summary.items() if "offsets" in k} == {
        k: v for k, v in offsets.items() if "offsets" in k
    }  # a replay moves no offsets
    assert dead_letters(path, "list", "--json") == []
    replayed = dead_letters(path, "list", "--all", "--json")
    assert {r["replayed_in"] for r in replayed} == {report["batch_id"]}
    again = dead_letters(path, "replay")
    assert (again["pending"], again["replayed"], again["tables"]) == (0, 0, [])
