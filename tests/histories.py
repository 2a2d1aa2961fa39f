"""Random change histories of one table as the connector writes them (creates, updates,
TOAST placeholders, primary-key changes, deletes, truncates, incremental snapshot reads
and connector replays), with the source's state after each record and the row versions
they hold: the reference the replay and history tests check against."""

from __future__ import annotations

import random
import zlib

from cdclake.raw_rows import NEW_KEY_HEADER, OLD_KEY_HEADER, kept_headers
from cdclake.resolve.rules import TOAST_PLACEHOLDER

from tests.debezium_records import key_record, value_record

T0 = 1_700_000_000_000


def ts_of(lsn: int) -> int:
    """The source time (ms) of the change at `lsn`."""
    return T0 + lsn


def item(i: int, name: str) -> dict:
    return {"id": i, "name": name, "price": None, "day": None, "at": None, "at_tz": None,
            "blob": None}  # fmt: skip


def _change(lsn: int, op: str, before: dict | None, after: dict | None) -> bytes:
    return value_record(op, before, after, lsn=lsn, ts_ms=ts_of(lsn))


def generate(
    rng: random.Random, steps: int, keys: int, truncates: bool = False, log: list | None = None
):
    """Kafka records (key, value, headers) and, per record, the source state once it is
    consumed, and the keys deleted by then with the value each had when it was deleted
    (what a soft-deleted row keeps).

    A replay re-sends a suffix of what was streamed, in order (Debezium restarting from an
    earlier committed position): after it, the source state is unchanged. An update may
    leave `name` unchanged (a TOAST placeholder). A primary-key change moves a row to a
    free key (a delete naming the new key, its tombstone, a create naming the old key,
    its `name` a placeholder): chains, cycles and the old key inserted again follow.
    With `truncates`, now and then the table is truncated (a record with no key).
    `log` takes each row version opened or closed, as (record index, key, name or None for
    a close, LSN), in source order: the history (SCD type 2) the records hold. Each change
    carries the source time of its LSN (`ts_of`).
    """
    log = [] if log is None else log
    state: dict[int, str] = {}
    gone: dict[int, str] = {}
    streamed: list[tuple] = []  # what a replay may re-send
    records: list[tuple] = []
    states: list[dict[int, str]] = []  # source state after records[i]
    gones: list[dict[int, str]] = []  # the deleted keys' last values after records[i]
    lsn = 100
    between: list[tuple] = []  # (state, gone) after each record of a change not yet whole
    for step in range(steps):
        action = rng.random()
        k = rng.randint(1, keys)
        free = [f for f in range(1, keys + 3) if f not in state]
        at = len(records)

        if action < 0.2 and len(streamed) > 2:  # connector restart: re-send a suffix
            starts = [i for i in range(max(0, len(streamed) - 8), len(streamed))
                      if streamed[i][1] is not None]  # fmt: skip
            new = streamed[rng.choice(starts) :]  # from a change, never from its tombstone
        elif action < 0.3 and k in state:  # incremental snapshot read: current value, no LSN
            read = value_record("r", None, item(k, state[k]), lsn=None, ts_ms=ts_of(lsn))
            new = [(key_record(k), read, None)]
        else:
            lsn += 10
            if truncates and action > 0.97:
                log.extend((at, key, None, lsn) for key in sorted(state))
                gone.update(state)
                state.clear()
                new = [(None, _change(lsn, "t", None, None), None)]
            elif k not in state:
                state[k] = f"v{step}"
                gone.pop(k, None)
                log.append((at, k, state[k], lsn))
                new = [(key_record(k), _change(lsn, "c", None, item(k, state[k])), None)]
            elif action < 0.55:
                state[k] = f"v{step}"
                log.append((at, k, state[k], lsn))
                new = [(key_record(k), _change(lsn, "u", None, item(k, state[k])), None)]
            elif action < 0.65:  # `name` unchanged: a TOAST placeholder
                new = [(key_record(k), _change(lsn, "u", None, item(k, TOAST_PLACEHOLDER)), None)]
            elif action < 0.8 and free:  # the key changes: the row moves, `name` unchanged
                to = rng.choice(free)
                gone[k] = state.pop(k)
                between = [(dict(state), dict(gone))] * 2  # the delete read, the create not
                state[to] = gone[k]
                gone.pop(to, None)
                log.extend([(at, k, None, lsn), (at + 2, to, state[to], lsn)])
                new = [(key_record(k), _change(lsn, "d", item(k, "x"), None),
                        kept_headers([(NEW_KEY_HEADER, key_record(to))])),
                       (key_record(k), None, None),
                       (key_record(to), _change(lsn, "c", None, item(to, TOAST_PLACEHOLDER)),
                        kept_headers([(OLD_KEY_HEADER, key_record(k))]))]  # fmt: skip
            else:
                gone[k] = state.pop(k)
                log.append((at, k, None, lsn))
                new = [(key_record(k), _change(lsn, "d", item(k, "x"), None), None),
                       (key_record(k), None, None)]  # fmt: skip
            streamed.extend(new)
        records.extend(new)
        states.extend([s for s, _ in between] + [dict(state)] * (len(new) - len(between)))
        gones.extend([g for _, g in between] + [dict(gone)] * (len(new) - len(between)))
        between = []
    return records, states, gones


def versions(log: list, upto: int) -> set[tuple]:
    """The row versions the records before index `upto` hold, from `generate`'s log: (key,
    name, LSN it opened at, LSN it closed at or None)."""
    open_: dict[int, tuple] = {}
    out: set[tuple] = set()
    for at, key, name, lsn in log:
        if at >= upto:
            break
        if key in open_:
            out.add((*open_.pop(key), lsn))
        if name is not None:
            open_[key] = (key, name, lsn)
    return out | {(*v, None) for v in open_.values()}


def placed(records, partitions: int) -> list[tuple]:
    """Each record (key, value, headers) as (partition, offset, key, value, headers): a
    key's records in one partition (as Kafka's partitioner sends them), a truncate's
    (no key) in the first."""
    ends = [0] * partitions
    out = []
    for key, value, headers in records:
        p = zlib.crc32(key) % partitions if key is not None else 0
        out.append((p, ends[p], key, value, headers))
        ends[p] += 1
    return out


def history_rows(spark, pipeline) -> set[tuple]:
    """(id, name, LSN opened at, LSN closed at) of the pipeline's one table's history,
    each row's times and current flag checked against its LSNs."""
    from cdclake.iceberg.history import history_table

    target = history_table(pipeline.qualified_target(pipeline.tables[0]))
    out = set()
    for r in spark.table(target).collect():
        start, end = (None if t is None else int(t.timestamp() * 1000) for t in
                      (r["_valid_from"], r["_valid_to"]))  # fmt: skip
        assert start == ts_of(r["_cdc_lsn"]), r
        assert r["_is_current"] == (end is None), r
        assert end is None or end == ts_of(r["_cdc_closed_lsn"]), r
        out.add((r["id"], r["name"], r["_cdc_lsn"], r["_cdc_closed_lsn"]))
    return out
