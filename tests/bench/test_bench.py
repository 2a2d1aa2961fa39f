"""The benchmark at a tiny scale: every figure is produced, and what it loaded is what the
events say (correctness only; no assertion on time)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from cdclake.bench.events import Workload, generate_slice
from cdclake.bench.runner import TARGETS, run_bench
from cdclake.bench.sources import _file_name, recorded_ranges
from cdclake.catalog import load_catalog
from cdclake.reader import split_envelope

pytestmark = pytest.mark.integration


def expected_rows(recording, topic: str) -> dict[int, int]:
    """key -> offset of its last change, for keys that exist at the end."""
    state: dict[int, int | None] = {}
    for r in recorded_ranges(recording):
        if r.topic != topic:
            continue
        t = pq.read_table(recording / _file_name(r.topic, r.partition)).to_pydict()
        for offset, key, value in zip(t["offset"], t["key"], t["value"], strict=True):
            k = json.loads(split_envelope(key)[1])["id"]
            if value is None or json.loads(split_envelope(value)[1])["op"] == "d":
                state[k] = None
            else:
                state[k] = offset
    return {k: o for k, o in state.items() if o is not None}


def test_generator_follows_each_rows_life():
    w = Workload.standard(400, 20, tables=1, partitions=1)
    ((topic, partition, count),) = w.slices()
    cols = next(generate_slice(w, topic, partition, 0, count))
    ops, alive = [], set()
    for key, value in zip(cols["key"], cols["value"], strict=True):
        k = json.loads(split_envelope(key)[1])["id"]
        op = "tombstone" if value is None else json.loads(split_envelope(value)[1])["op"]
        if op == "c":
            assert k not in alive
            alive.add(k)
        elif op in ("u", "d"):
            assert k in alive
            if op == "d":
                alive.discard(k)
        else:
            assert ops[-1] == "d"
        ops.append(op)
    assert {"c", "u", "d", "tombstone"} <= set(ops)


def test_bench_small_scale_reports_every_figure(stack, tmp_path):
    out = tmp_path / "bench.json"
    report = run_bench(0.001, tmp_path / "work", out)
    written = json.loads(out.read_text())
    assert written["figures"] == pytest.approx(report["figures"])
    assert not written["details"].get("errors"), written["details"].get("errors")
    assert set(TARGETS) <= set(written["figures"])

    namespace = written["details"]["throughput"]["namespace"]
    catalog = load_catalog_for(stack)
    recording = tmp_path / "work" / "recording"
    for topic in {r.topic for r in recorded_ranges(recording)}:
        table = catalog.load_table((namespace, topic.rsplit(".", 1)[1])).scan().to_arrow()
        lake = dict(zip(table["id"].to_pylist(), table["_cdc_kafka_offset"].to_pylist(),
                        strict=True))  # fmt: skip
        assert lake == expected_rows(recording, topic)


def load_catalog_for(stack):
    from cdclake.config import CatalogConfig

    s = stack.s
    return load_catalog(
        CatalogConfig(
            name="lake",
            type="jdbc",
            uri=f"jdbc:postgresql://127.0.0.1:{s.pg_port}/{s.catalog_db}",
            warehouse=(s.state_dir / "warehouse").as_uri(),
            properties={"jdbc.user": "postgres", "jdbc.password": ""},
        )
    )
