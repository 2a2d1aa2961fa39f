"""Record templates captured from the real Debezium PostgreSQL connector.

Three wide tables (text, numeric, timestamps, jsonb, arrays) get a few inserts, updates
and deletes on the local stack; the raw Kafka records the connector produced for them
(key, value, headers, timestamp) are saved per table and operation. The event generator
expands these into any number of events, so benchmark input has the connector's exact
bytes: JSON-with-schema envelopes of 3–4 KB with the schema first.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

TEMPLATES_FILE = Path(__file__).with_name("templates.json")
SCHEMA = "inventory"
TABLES = ("bench_accounts", "bench_orders", "bench_events")
OPS = ("c", "u", "d", "tombstone")

_FILLER = "(select string_agg(md5((random() * {i})::text), ' ') from generate_series(1, {n}))"

DDL = {
    "bench_accounts": (
        "id bigint primary key, name text, email text, city text, balance numeric(12,2), "
        "status text, created_at timestamptz, updated_at timestamp, is_active boolean, "
        "notes text, profile jsonb"
    ),
    "bench_orders": (
        "id bigint primary key, account_id bigint, sku text, description text, "
        "quantity int, price numeric(10,2), ordered_at timestamptz, shipped_on date, notes text"
    ),
    "bench_events": (
        "id bigint primary key, kind text, occurred_at timestamp, amount numeric(14,4), "
        "body text, attrs jsonb, session_id text"
    ),
}

INSERT = {
    "bench_accounts": (
        "insert into {t} values ({i}, 'Name {i}', 'user{i}@example.com', 'Springfield', "
        "1234.56, 'active', now(), localtimestamp, true, {f12}, "
        "jsonb_build_object('bio', {f4}))"
    ),
    "bench_orders": (
        "insert into {t} values ({i}, {i} * 7, 'SKU-{i}', {f8}, 3, 19.99, now(), "
        "current_date, {f8})"
    ),
    "bench_events": (
        "insert into {t} values ({i}, 'page_view', localtimestamp, 12.3456, {f20}, "
        "jsonb_build_object('path', '/a/b', 'q', {f2}), md5('{i}'))"
    ),
}
UPDATE = {
    "bench_accounts": "update {t} set status = 'suspended', notes = {f12} where id = {i}",
    "bench_orders": "update {t} set quantity = quantity + 1, notes = {f8} where id = {i}",
    "bench_events": "update {t} set kind = 'click', body = {f20} where id = {i}",
}


@dataclass(frozen=True)
class Template:
    """One raw Kafka record the connector wrote for a table and operation."""

    table: str
    op: str  # c | u | d | tombstone
    key: str
    value: str | None
    headers: tuple[tuple[str, str], ...]
    timestamp: int


def _fill(sql: str, table: str, i: int) -> str:
    sizes = {f"f{n}": _FILLER.format(i=i + n, n=n) for n in (2, 4, 6, 8, 12, 20, 24)}
    return sql.format(t=f"{SCHEMA}.{table}", i=i, **sizes)


def capture_templates(stack, out: Path = TEMPLATES_FILE) -> list[Template]:
    """Make changes on the three tables through the real connector and keep one record of
    each kind per table (`stack` is a started LocalStack)."""
    import psycopg

    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"drop table if exists {SCHEMA}.{table}")
            conn.execute(f"create table {SCHEMA}.{table} ({DDL[table]})")
            for i in (1, 2):
                conn.execute(_fill(INSERT[table], table, i))
            conn.execute(_fill(UPDATE[table], table, 1))
            conn.execute(f"delete from {SCHEMA}.{table} where id = 2")
    stack.wait_for_capture()
    templates = []
    for table in TABLES:
        topic = f"{stack.s.topic_prefix}.{SCHEMA}.{table}"
        found = _first_of_each(stack.broker.client_config(), topic)
        templates.extend(found[op] for op in OPS)
    out.write_text(json.dumps([t.__dict__ for t in templates], indent=1) + "\n")
    log.info("wrote %d templates to %s", len(templates), out)
    return templates


def _first_of_each(client_config: dict, topic: str) -> dict[str, Template]:
    """The last record of each kind in the topic (the latest table definition)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {**client_config, "group.id": "cdclake-bench-templates",
         "enable.partition.eof": True, "enable.auto.commit": False}
    )  # fmt: skip
    found: dict[str, Template] = {}
    table = topic.rsplit(".", 1)[1]
    try:
        md = consumer.list_topics(topic, timeout=10).topics[topic]
        for p in md.partitions:
            consumer.assign([TopicPartition(topic, p, 0)])
            while True:
                msg = consumer.poll(10)
                if msg is None or (msg.error() and msg.error().code() == -191):
                    break
                if msg.error():
                    raise RuntimeError(str(msg.error()))
                value = msg.value()
                op = "tombstone" if value is None else json.loads(value)["payload"]["op"]
                if op in OPS:
                    found[op] = Template(
                        table=table, op=op, key=msg.key().decode(),
                        value=None if value is None else value.decode(),
                        headers=tuple((k, v.decode()) for k, v in (msg.headers() or [])),
                        timestamp=msg.timestamp()[1],
                    )  # fmt: skip
    finally:
        consumer.close()
    missing = [op for op in OPS if op not in found]
    if missing:
        raise RuntimeError(f"{topic}: no {missing} record captured")
    return found


def load_templates(path: Path = TEMPLATES_FILE) -> dict[str, dict[str, Template]]:
    """Templates by table and operation."""
    out: dict[str, dict[str, Template]] = {}
    for raw in json.loads(path.read_text()):
        raw["headers"] = tuple(tuple(h) for h in raw["headers"])
        t = Template(**raw)
        out.setdefault(t.table, {})[t.op] = t
    return out
