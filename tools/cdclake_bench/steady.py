"""The steady-state steps: a batch MERGEd into tables that hold its keys, then into tables
of 10M rows, each beside pyiceberg's upsert of the same batch into tables filled alike."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

from cdclake_bench.events import Workload
from cdclake_bench.pipeline import bench_pipeline
from cdclake_bench.sources import fill_select, record_workload, recorded_ranges, split_recording


class SteadySteps:
    """Steps of `cdclake_bench.runner.Bench` (which gives `sizes`, `work`, `stack`,
    `figures`, `details`, `say`, `session` and `_recorded_batch`)."""

    def throughput_merge(self) -> None:
        """A batch of the throughput step's size whose changes MERGE into tables that
        already hold its keys: a pipeline's steady state (the throughput step's batch
        creates its tables, which a first load writes without a MERGE). Twice the events
        over the same keys are recorded; each topic-partition's first half is loaded into
        new tables (untimed), then its second half, timed, in a cold process of its own
        as the throughput step's batch."""
        workload, first, second = self._merge_recording()
        pipeline = bench_pipeline(self.work, self.stack.s, workload, "merge")
        before = self._recorded_batch(pipeline, first, "bench-merge-first")
        out = self._recorded_batch(pipeline, second, "bench-merge")
        events = sum(r.size for r in recorded_ranges(second))
        self.figures["throughput_merge_eps"] = events / out["wall_s"]
        self.figures["merge_cpu_s_per_m"] = sum(out["cpu_s"].values()) / events * 1e6
        self.say(f"MERGEd into tables that hold the keys: {events / out['wall_s']:,.0f} "
                 f"events/s ({out['wall_s']:.1f}s; the first load before it "
                 f"{before['wall_s']:.1f}s)")  # fmt: skip
        peer = self._peer_steady(pipeline, first, second)
        self.figures["peer_merge_ratio"] = events / out["wall_s"] / peer["eps"]
        self.details["throughput_merge"] = out | {"events": events, "first_load": before,
                                                  "peer": peer}  # fmt: skip

    def throughput_merge_big(self) -> None:
        """`throughput_merge`'s second half MERGEd into tables of `merge_rows[1]` rows in
        all: its first half's keys and filler rows of other keys. Then pyiceberg's upsert
        of it into its own tables, filled alike."""
        z = self.sizes
        workload, first, second = self._merge_recording()
        pipeline = bench_pipeline(self.work, self.stack.s, workload, "mergebig")
        self._recorded_batch(pipeline, first, "bench-mergebig-first")
        filler = z.merge_rows[1] // z.tables
        self._fill([pipeline.qualified_target(t) for t in pipeline.tables], filler, pipeline)
        out = self._recorded_batch(pipeline, second, "bench-mergebig")
        events = sum(r.size for r in recorded_ranges(second))
        self.figures["throughput_merge_big_eps"] = events / out["wall_s"]
        self.say(f"MERGEd into {z.merge_rows[1]:,} rows: {events / out['wall_s']:,.0f} "
                 f"events/s ({out['wall_s']:.1f}s)")  # fmt: skip

        def prepare(names: list[str]) -> None:
            self._fill([f"{pipeline.catalog.name}.{n}" for n in names], filler, pipeline)

        peer = self._peer_steady(pipeline, first, second, prepare)
        self.figures["peer_merge_big_ratio"] = events / out["wall_s"] / peer["eps"]
        self.details["throughput_merge_big"] = out | {"events": events, "rows": z.merge_rows[1],
                                                      "peer": peer}  # fmt: skip

    def throughput_history(self) -> None:
        """`throughput_merge` with `history: true` on every table: the same first load
        (untimed) and batch, timed, each table's row versions written beside it. Its
        events/s over `throughput_merge`'s is what keeping the history costs (1: nothing)."""
        workload, first, second = self._merge_recording()
        pipeline = bench_pipeline(self.work, self.stack.s, workload, "history", history=True)
        self._recorded_batch(pipeline, first, "bench-history-first")
        out = self._recorded_batch(pipeline, second, "bench-history")
        events = sum(r.size for r in recorded_ranges(second))
        eps = events / out["wall_s"]
        self.figures["throughput_history_eps"] = eps
        merge = self.figures.get("throughput_merge_eps")
        if merge:
            self.figures["history_ratio"] = eps / merge
        self.say(f"with history: {eps:,.0f} events/s ({out['wall_s']:.1f}s), "
                 f"{eps / merge if merge else float('nan'):.2f} of without")  # fmt: skip
        self.details["throughput_history"] = out | {"events": events}

    def _merge_recording(self) -> tuple[Workload, Path, Path]:
        """Twice the throughput step's events over its keys, split into a first load and
        a batch MERGEd into it (`split_recording`). A recording of the same sizes in
        `<work>/recording-merge` is reused (the events are a function of the sizes); one
        of other sizes is recorded again."""
        z = self.sizes
        workload = Workload.standard(2 * z.events, z.keys, tables=z.tables)
        rec = self.work / "recording-merge"
        sizes = {"events": 2 * z.events, "keys": z.keys, "tables": z.tables}
        stamp = rec / "sizes.json"
        if not stamp.exists() or json.loads(stamp.read_text()) != sizes:
            shutil.rmtree(rec, ignore_errors=True)
            self.say(f"recording {2 * z.events:,} events over {z.keys:,} keys: a first load, "
                     "then a batch of the same keys MERGEd into it")  # fmt: skip
            split_recording(rec, record_workload(workload, rec, log_every=0))
            stamp.write_text(json.dumps(sizes))
        return workload, rec / "first", rec / "second"

    def _fill(self, tables: list[str], rows: int, pipeline) -> None:
        """`rows` filler rows into each table, keys past the workload's."""
        spark = self.session(pipeline)
        for table in tables:
            self.say(f"filling {table} with {rows:,} more rows")
            spark.sql(f"INSERT INTO {table} "
                      f"{fill_select(spark, table, rows, start=self.sizes.keys + 1)}")  # fmt: skip

    def _peer_steady(self, pipeline, first: Path, second: Path, prepare=None) -> dict:
        """pyiceberg's upsert of the second half, each table's events in one call, into
        tables that hold the first half (the peers step's one-call peer, in the steady
        state); `prepare`: called with its tables' names before the timed upsert."""
        from cdclake.iceberg.catalog import load_catalog

        from cdclake_bench.peers import peer_upsert

        namespace = f"peer_merge_{uuid.uuid4().hex[:6]}"
        self.say("pyiceberg upsert of the same batch into tables that hold the first half")
        ranges = recorded_ranges(second)
        wall = peer_upsert(load_catalog(pipeline.catalog), namespace, second, ranges,
                           populated=(first, recorded_ranges(first)),
                           prepare=prepare)  # fmt: skip
        events = sum(r.size for r in ranges)
        self.say(f"pyiceberg upsert into populated tables: {events / wall:,.0f} events/s")
        return {"eps": events / wall, "wall_s": wall, "namespace": namespace}
