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


def resent(client_config: dict, topic: str) -> int:
    """Records of the topic that carry a change already in it (the same LSN and key)."""
    consumer = Consumer({**client_config, "group.id": uuid.uuid4().hex,
                         "enable.auto.commit": False})  # fmt: skip
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, low)])
        seen, again, offset = set(), 0, low
        while offset < high - 1:
            msg = consumer.poll(10)
            assert msg is not None, f"{topic}: no record at offset {offset + 1} of {high}"
            offset = msg.offset()
            if msg.value() is None:
                continue
            payload = json.loads(msg.value())["payload"]
            change = (msg.key(), payload["source"]["lsn"], payload["op"])
            again += change in seen
            seen.add(change)
        return again
    finally:
        consumer.close()


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
    for i in range(200):  # the rest, in batches of the pipeline's size
        plan = plan_pipeline(pipeline, f"restarts-end-{i}")
        if not plan.ranges:
            break
        run_batch(spark, pipeline, plan)
    assert_lake_equals_source(pipeline, stack.source_dsn)
    assert again > 0, f"no change was sent again (seed {seed})"
