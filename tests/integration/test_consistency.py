"""Tables consistent as of one source transaction (`consistency: transaction`), on the
local stack's connector, which publishes transaction metadata: multi-table transactions
that keep invariants, loaded in batches of random sizes, some of them failing half-way."""

from __future__ import annotations

import dataclasses
import random
import time
import uuid

import psycopg
import pytest
from cdclake.iceberg.tags import CONSISTENT_TAG, cut_tag
from cdclake.job import run_batch
from cdclake_control.freshness import pipeline_freshness
from cdclake_control.planner import plan_pipeline

from tests.integration.helpers import assert_lake_equals_source, load_all, make_pipeline

ACCOUNTS, BALANCE = 10, 100
SETTLE_S = 10.5  # every END record settled (`consistency.SETTLED_MS`)


def write_transactions(dsn: str, tables: dict[str, str], seed: int, count: int) -> None:
    """Transfers between an account of `a` and one of `b` (the sum stays), and orders
    inserted with their lines (every line's order exists), each in one transaction."""
    rng = random.Random(seed)
    a, b, orders, lines = (tables[k] for k in ("a", "b", "orders", "lines"))
    with psycopg.connect(dsn) as conn:
        for i in range(count):
            with conn.transaction():
                if i % 3:
                    amount = rng.randint(1, 9)
                    conn.execute(
                        f"update {a} set balance = balance - %s where id = %s",
                        (amount, rng.randint(1, ACCOUNTS)),
                    )
                    conn.execute(
                        f"update {b} set balance = balance + %s where id = %s",
                        (amount, rng.randint(1, ACCOUNTS)),
                    )
                else:
                    conn.execute(f"insert into {orders} values ({i})")
                    conn.execute(f"insert into {lines} values ({i}, {i}), ({i}, {i + 1000})")


def invariants(spark, tables: dict[str, str], version: str | None) -> tuple[int, int]:
    """The sum of both accounts' balances, and the lines whose order is missing, as the
    lake holds them (at tag `version`, or now)."""
    at = f" VERSION AS OF '{version}'" if version else ""
    total = (
        spark.sql(
            f"SELECT (SELECT coalesce(sum(balance), 0) FROM {tables['a']}{at}) + "
            f"(SELECT coalesce(sum(balance), 0) FROM {tables['b']}{at}) AS s"
        )
        .collect()[0]
        .s
    )
    orphans = (
        spark.sql(
            f"SELECT count(*) AS n FROM {tables['lines']}{at} l LEFT ANTI JOIN "
            f"{tables['orders']}{at} o ON l.order_id = o.id"
        )
        .collect()[0]
        .n
    )
    return int(total), int(orphans)


def setup(stack, spark, tmp_path, n: str, **fields):
    """Four tables, loaded whole before the transactions start."""
    source = {k: f"inventory.tx_{k}_{n}" for k in ("a", "b", "orders", "lines")}
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        for key in ("a", "b"):
            conn.execute(f"create table {source[key]} (id int primary key, balance int)")
            conn.execute(
                f"insert into {source[key]} select g, {BALANCE} "
                f"from generate_series(1, {ACCOUNTS}) g"
            )
        conn.execute(f"create table {source['orders']} (id int primary key)")
        conn.execute(f"create table {source['lines']} (order_id int, id int primary key)")
        conn.execute(f"insert into {source['orders']} values (-1)")
        conn.execute(f"insert into {source['lines']} values (-1, -1)")
    pipeline = make_pipeline(tmp_path, f"it_tx_{n}", list(source.values()), **fields)
    lake = {k: pipeline.qualified_target(pipeline.table_named(v)) for k, v in source.items()}
    stack.wait_for_capture()
    if fields.get("consistency"):
        time.sleep(SETTLE_S)
    load_all(stack, spark, pipeline, f"tx-{n}-setup")
    assert invariants(spark, lake, None) == (2 * ACCOUNTS * BALANCE, 0)
    return pipeline, source, lake


def test_every_table_is_tagged_at_one_transaction_and_the_invariants_hold_at_each_tag(
    stack, spark, tmp_path, monkeypatch
):
    """Batches of random sizes cut at a transaction for every table, the moving tag and
    the cut's own tag on each table at the same cut, the invariants true at every tag;
    a batch that fails after its first table committed moves no tag, and the next one
    comes back to a consistent cut."""
    import cdclake.job

    n = uuid.uuid4().hex[:6]
    pipeline, source, lake = setup(
        stack, spark, tmp_path, n, consistency="transaction", parallel_tables=1
    )
    write_transactions(stack.source_dsn, source, seed=7, count=45)
    stack.wait_for_capture()
    time.sleep(SETTLE_S)
    rng, failed, tags = random.Random(7), 0, []
    write_table = cdclake.job.write_table

    def killed_after_the_first_table(batch, table, *args, **kwargs):
        if written:
            raise RuntimeError("killed after the first table committed")
        written.append(table)
        return write_table(batch, table, *args, **kwargs)

    for i in range(40):
        capped = dataclasses.replace(pipeline, max_records_per_batch=rng.randint(6, 40))
        plan = plan_pipeline(capped, f"tx-{n}-{i}")
        if not plan.ranges:
            break
        assert plan.cut is not None
        if i in (1, 3):  # a load killed half-way: one table committed, the others not
            written = []
            with monkeypatch.context() as m:
                m.setattr(cdclake.job, "write_table", killed_after_the_first_table)
                with pytest.raises(RuntimeError, match="killed"):
                    run_batch(spark, capped, plan)
            failed += 1
            continue
        results = run_batch(spark, capped, plan)
        assert {r.consistent for r in results} == {plan.cut.describe()}
        tags.append(plan.cut)
        assert invariants(spark, lake, CONSISTENT_TAG) == (2 * ACCOUNTS * BALANCE, 0)
        for table in lake.values():  # every table, changed or not, at the cut's tag
            refs = spark.sql(f"SELECT name, snapshot_id FROM {table}.refs").collect()
            at = {r.name: r.snapshot_id for r in refs}
            assert at[cut_tag(plan.cut)] == at[CONSISTENT_TAG], (table, at)
    else:
        raise AssertionError("not drained in 40 batches")
    assert failed == 2 and len(tags) >= 3, (failed, tags)
    assert [t.after for t in tags] == sorted(t.after for t in tags)  # never backwards
    assert invariants(spark, lake, None) == (2 * ACCOUNTS * BALANCE, 0)
    assert_lake_equals_source(pipeline, stack.source_dsn)
    # `cdclake status` and the freshness page say as of when
    rows = pipeline_freshness(pipeline, int(time.time() * 1000))
    assert {r.consistent for r in rows} == {tags[-1].describe()}, rows


def test_without_the_setting_small_batches_can_break_the_invariants(stack, spark, tmp_path):
    """The same transactions in batches each table cuts at its own offsets: at some
    batch the lake shows a transfer or an order half applied."""
    n = uuid.uuid4().hex[:6]
    pipeline, source, lake = setup(stack, spark, tmp_path, n)
    write_transactions(stack.source_dsn, source, seed=7, count=60)
    stack.wait_for_capture()
    seen = []
    for i in range(6):
        capped = dataclasses.replace(pipeline, max_records_per_batch=9)
        run_batch(spark, capped, plan_pipeline(capped, f"notx-{n}-{i}"))
        seen.append(invariants(spark, lake, None))
    assert any(s != (2 * ACCOUNTS * BALANCE, 0) for s in seen), seen
    load_all(stack, spark, pipeline, f"notx-{n}-z")
    assert invariants(spark, lake, None) == (2 * ACCOUNTS * BALANCE, 0)
