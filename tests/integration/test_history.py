"""History tables (SCD type 2) on the real connector: a row per version, TOAST values
carried through updates and key changes, deletes, re-inserts and a truncate closing
versions, and `cdclake compare` checking the current versions against the source. (Random
histories against a reference model: `test_random_replay`, `tests/unit/test_history`.)"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from cdclake.iceberg.history import history_table
from cdclake.iceberg.tables import table_state
from cdclake_control.compare import compare_pipeline

from tests.integration.helpers import load_all, make_pipeline

pytestmark = pytest.mark.integration

BIG = "(select string_agg(md5(random()::text), '') from generate_series(1, 400))"


def source_state(conn, table: str) -> dict[int, tuple]:
    rows = conn.execute(f"select id, note, md5(body) from {table}").fetchall()
    return {i: (note, body) for i, note, body in rows}


def expected_versions(states: list[dict[int, tuple]]) -> dict[int, list[tuple]]:
    """Per key, its versions (the state's values, open) from the source's state after
    each transaction."""
    out: dict[int, list[list]] = {}
    last: dict[int, tuple] = {}
    for state in states:
        for key in set(last) | set(state):
            now, was = state.get(key), last.get(key)
            if now == was:
                continue
            if was is not None:
                out[key][-1][-1] = False
            if now is not None:
                out.setdefault(key, []).append([*now, True])
        last = state
    return {k: [tuple(v) for v in vs] for k, vs in out.items()}


def lake_versions(spark, pipeline) -> dict[int, list[tuple]]:
    """Per key, its history rows' (note, md5 of body, open) in time order; each closed
    version ends no later than the next begins."""
    target = history_table(pipeline.qualified_target(pipeline.tables[0]))
    rows = spark.sql(
        f"SELECT id, note, md5(body) AS body, _valid_from, _valid_to, _is_current, _cdc_lsn "
        f"FROM {target} ORDER BY id, _valid_from, _cdc_lsn"
    ).collect()
    out: dict[int, list] = {}
    for r in rows:
        versions = out.setdefault(r["id"], [])
        if versions:
            assert versions[-1][1]["_valid_to"] is not None, (versions, r)
            assert versions[-1][1]["_valid_to"] <= r["_valid_from"], (versions, r)
        assert r["_is_current"] == (r["_valid_to"] is None), r
        versions.append(((r["note"], r["body"], r["_is_current"]), r))
    return {k: [v for v, _ in vs] for k, vs in out.items()}


def history_offsets(spark, target: str) -> dict:
    return table_state(spark, history_table(target)).committed


def table_offsets(spark, target: str) -> dict:
    return table_state(spark, target).committed


def test_history_keeps_every_version_with_toast_values_through_key_changes(stack, spark,
                                                                          tmp_path):  # fmt: skip
    n = uuid.uuid4().hex[:6]
    t = f"inventory.hist_{n}"
    pipeline = make_pipeline(tmp_path, f"it_hist_{n}", [{"source": t, "history": True}])
    steps = [
        [f"create table {t} (id int primary key, note text, body text)",
         f"alter table {t} alter column body set storage external",
         f"insert into {t} select g, 'n' || g, {BIG} from generate_series(1, 5) g"],
        [f"update {t} set note = 'one' where id = 1",  # body unchanged: a placeholder
         f"update {t} set id = 12 where id = 2",  # a key change, body unchanged
         f"insert into {t} values (2, 'two again', {BIG})",  # the old key again
         f"update {t} set id = 13 where id = 12",  # a chain
         f"delete from {t} where id = 3",
         f"update {t} set body = {BIG} where id = 4",
         f"update {t} set note = note where id = 5"],  # the same row: no version
        [f"insert into {t} values (3, 'three again', {BIG})",
         f"update {t} set note = 'thirteen' where id = 13",
         f"truncate {t}",
         f"insert into {t} values (1, 'after', {BIG})"],
    ]  # fmt: skip
    # another pipeline loads the table without its history, which is turned on later
    late = make_pipeline(tmp_path, f"it_late_{n}", [t])
    # and one whose versions follow `note` only: `body` is set in the open version
    tracked = {"source": t, "history": True, "history_columns": ["note"]}
    notes = make_pipeline(tmp_path, f"it_notes_{n}", [tracked])
    states: list[dict[int, tuple]] = []
    target = pipeline.qualified_target(pipeline.tables[0])
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        for i, statements in enumerate(steps):
            for s in statements:
                conn.execute(s)
                if not s.startswith(("create", "alter")):
                    states.append(source_state(conn, t))
            before = table_state(spark, target).snapshot_id
            load_all(stack, spark, pipeline, f"hist-{i}")
            assert lake_versions(spark, pipeline) == expected_versions(states), f"step {i}"
            compared = compare_pipeline(pipeline, stack.source_dsn)
            assert [c.target for c in compared] == [
                pipeline.qualified_target(pipeline.tables[0]),
                history_table(pipeline.qualified_target(pipeline.tables[0])),
            ]
            assert all(c.equal for c in compared), [(c.missing, c.extra) for c in compared]
            load_all(stack, spark, notes, f"notes-{i}")
            by_note = [{k: v[:1] for k, v in state.items()} for state in states]
            got = {k: [(v[0], v[2]) for v in vs] for k, vs in lake_versions(spark, notes).items()}
            assert got == expected_versions(by_note), f"step {i}"
            assert all(c.equal for c in compare_pipeline(notes, stack.source_dsn))
            if i == 0:
                load_all(stack, spark, late, "late-0")
                late = make_pipeline(tmp_path, f"it_late_{n}", [{"source": t, "history": True}])
            if i == 1:  # history on for a table loaded before: its rows are the first versions
                load_all(stack, spark, late, "late-1")
                assert all(c.equal for c in compare_pipeline(late, stack.source_dsn))
                seeded = lake_versions(spark, late)
                assert seeded[1] == [(*states[0][1], False), (*states[-1][1], True)], seeded
                assert seeded[13] == [(*states[-1][13], True)]  # a key change: the new key's
            if i == 1:  # the table's commit lost after the history's: the next batch reads
                # these changes again, and the history adds nothing of them
                table = target.split(".", 1)[1]
                spark.sql(f"CALL {pipeline.catalog.name}.system.rollback_to_snapshot("
                          f"'{table}', {before})")  # fmt: skip
                assert history_offsets(spark, target) != table_offsets(spark, target)
    # the chain 2 -> 12 -> 13 kept key 2's body, not the body of the row inserted as 2 after
    first_two = [v for v in expected_versions(states)[2]][0]
    assert lake_versions(spark, pipeline)[13][0][1] == first_two[1]
    # a rebuild backfill builds the history again from Kafka
    from cdclake_control.backfill import parse_request, plan_pipeline_backfill, run_backfill

    rebuild = dict(tables=[t], mode="rebuild", start="earliest", end="latest")
    run_backfill(spark, pipeline, plan_pipeline_backfill(pipeline, parse_request(pipeline,
                                                         **rebuild), "hist-rebuild"))  # fmt: skip
    assert lake_versions(spark, pipeline) == expected_versions(states)
    assert all(c.equal for c in compare_pipeline(pipeline, stack.source_dsn))
    # maintenance compacts and expires the history too, its offsets kept
    from cdclake.iceberg.maintenance import run_maintenance

    offsets = history_offsets(spark, target)
    done = run_maintenance(pipeline, spark)
    assert [(t["table"], t["status"]) for t in done["tables"]] == [
        (target, "maintained"),
        (history_table(target), "maintained"),
    ]
    assert history_offsets(spark, target) == offsets
    assert lake_versions(spark, pipeline) == expected_versions(states)
