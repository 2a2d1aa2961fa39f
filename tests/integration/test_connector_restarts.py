"""The real connector restarting while the source changes: Kafka Connect's worker is
killed (SIGKILL) or stopped in the middle of random writes, Debezium sends again what it had not
committed (at-least-once), and loads run in random batch sizes in between; in the end the
lake equals the source."""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid

import psycopg
import pytest
from cdclake.job import run_batch
from cdclake_control.planner import plan_pipeline
from confluent_kafka import Consumer, TopicPartition

from tests.integration.helpers import assert_lake_equals_source, make_pipeline

pytestmark = pytest.mark.integration

BIG = 6000  # characters of `big`, stored out of line (TOAST), unchanged by most updates


def write(conn, rng: random.Random, t: str, live: set[int], steps: int, pause: float = 0.0) -> None:
    """Random inserts, updates (most leave `big` alone: Debezium sends a placeholder),
    deletes and primary-key changes, each its own transaction or a few together, `pause`
    seconds apart."""
    for _ in range(steps):
        with conn.transaction():
            for _ in range(rng.randint(1, 3)):
                step(conn, rng, t, live)
        time.sleep(pause)


def step(conn, rng: random.Random, t: str, live: set[int]) -> None:
    action, key = rng.random(), rng.randint(1, 60)
    if key not in live:
        big = rng.randbytes(BIG // 2).hex()
        conn.execute(f"insert into {t} values (%s, %s, 'new', %s)", (key, rng.randint(0, 9), big))
        live.add(key)
    elif action < 0.5:
        conn.execute(f"update {t} set v = v + 1, note = 'updated' where id = %s", (key,))
    elif action < 0.6:
        conn.execute(f"update {t} set big = %s where id = %s", (rng.randbytes(BIG // 2).hex(), key))
    elif action < 0.8:
        conn.execute(f"delete from {t} where id = %s", (key,))
        live.discard(key)
    elif (new := rng.randint(61, 120)) not in live:  # a key change, with a new big value
        big = rng.randbytes(BIG // 2).hex()
        conn.execute(f"update {t} set id = %s, big = %s where id = %s", (new, big, key))
        live.discard(key)
        live.add(new)


def write_in_thread(dsn: str, seed: float, t: str, live: set[int], steps: int) -> None:
    # the changes stream for 1.5-3.5 s: the worker's stop (0.5-2 s in) falls while it
    # sends them, past its last offset commit (every second), so it sends some again
    with psycopg.connect(dsn, autocommit=True) as conn:
        write(conn, random.Random(seed), t, live, steps, pause=0.025)


def records(client_config: dict, topic: str) -> list[tuple[int, dict | None, dict | None]]:
    """The topic's records (one partition) as (offset, key payload, value payload)."""
    consumer = Consumer({**client_config, "group.id": uuid.uuid4().hex,
                         "enable.auto.commit": False})  # fmt: skip
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, low)])
        out, offset = [], low - 1
        while offset < high - 1:
            msg = consumer.poll(10)
            assert msg is not None, f"{topic}: no record at offset {offset + 1} of {high}"
            offset = msg.offset()
            key, value = (json.loads(m)["payload"] if m else None for m in (msg.key(), msg.value()))
            out.append((offset, key, value))
        return out
    finally:
        consumer.close()


def resent(client_config: dict, topic: str) -> int:
    """Records of the topic that carry a change already in it (the same LSN and key)."""
    seen, again = set(), 0
    for _, key, value in records(client_config, topic):
        if value is not None:
            change = (json.dumps(key), value["source"]["lsn"], value["op"])
            again += change in seen
            seen.add(change)
    return again


def diagnosis(stack, spark, pipeline, seed: int) -> str:
    """The keys whose rows differ, each with its source row, its lake row and its records
    in the topic (`big` as a digest): what a failure needs to be understood."""
    table = pipeline.tables[0]
    query = "select id, v, note, md5(big) from {}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        source = {r[0]: tuple(r) for r in conn.execute(query.format(table.source))}
    lake_rows = spark.sql(query.format(pipeline.qualified_target(table))).collect()
    lake = {r[0]: tuple(r) for r in lake_rows}
    differ = sorted(k for k in source.keys() | lake.keys() if source.get(k) != lake.get(k))
    history: dict[int, list[str]] = {}
    for offset, key, value in records(stack.broker.client_config(), pipeline.topic_for(table)):
        if key is None or key["id"] not in differ[:5]:
            continue
        row = (value and (value["after"] or value["before"])) or {}
        big = row.get("big")
        big = big if big is None or big.startswith("__debezium") else big[:8]
        lsn = value and value["source"]["lsn"]
        history.setdefault(key["id"], []).append(
            f"@{offset} {value and value['op']} lsn={lsn} v={row.get('v')} "
            f"note={row.get('note')} big={big}"
        )
    lines = [f"seed {seed}: {len(differ)} key(s) differ: {differ[:20]}"]
    for k in differ[:5]:
        lines.append(f"key {k}: source {source.get(k)}, lake {lake.get(k)}")
        lines.extend(f"  {h}" for h in history.get(k, []))
    return "\n".join(lines)


def test_connector_restarts_resend_changes_and_the_lake_still_equals_the_source(
    stack, spark, tmp_path
):
    seed = int(os.environ.get("CDCLAKE_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (CDCLAKE_TEST_SEED repeats it)")
    rng = random.Random(seed)
    n = uuid.uuid4().hex[:6]
    t = f"inventory.restarts_{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {t} (id int primary key, v int, note text, big text)")
        conn.execute(f"alter table {t} alter column big set storage external")
    pipeline = make_pipeline(tmp_path, f"it_restarts_{n}", [t],
                             max_records_per_batch=rng.randint(20, 200))  # fmt: skip
    live: set[int] = set()
    topic = pipeline.topic_for(pipeline.tables[0])
    again, round_ = 0, 0
    # four rounds, the worker stopped in one and killed in the others; more rounds (ten
    # at most) until a kill caught records the worker had not committed
    while round_ < 4 or (not again and round_ < 10):
        # the connector stops while changes stream: killed, it sends again what it sent
        # since its last offset commit (every second)
        writes = rng.randint(60, 150)
        writer = threading.Thread(target=write_in_thread,
                                  args=(stack.source_dsn, rng.random(), t, live,
                                        writes))  # fmt: skip
        writer.start()
        time.sleep(rng.uniform(0.5, 2.0))
        stack.restart_capture(kill=round_ != 1)
        writer.join()
        for i in range(rng.randint(0, 2)):
            plan = plan_pipeline(pipeline, f"restarts-{round_}-{i}")
            if plan.ranges:
                run_batch(spark, pipeline, plan)
        stack.wait_for_capture()
        again = resent(stack.broker.client_config(), topic)
        round_ += 1
    stack.wait_for_capture()
    for i in range(1000):  # the rest, in batches of the pipeline's size
        plan = plan_pipeline(pipeline, f"restarts-end-{i}")
        if not plan.ranges:
            break
        run_batch(spark, pipeline, plan)
    assert not plan.ranges, f"records left after 1000 batches (seed {seed})"
    try:
        assert_lake_equals_source(pipeline, stack.source_dsn)
    except AssertionError:
        raise AssertionError(diagnosis(stack, spark, pipeline, seed)) from None
    assert again > 0, f"no change was sent again (seed {seed})"
