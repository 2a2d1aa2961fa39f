"""The table-size steps: a MERGE's cost against the size of the table it changes, and
Iceberg v3 deletion vectors against v2 position deletes in a big table."""

from __future__ import annotations

import statistics
import time
import uuid

from cdclake.job import run_batch
from cdclake.offsets import BatchPlan, OffsetRange

from cdclake_bench.events import Workload
from cdclake_bench.pipeline import bench_pipeline
from cdclake_bench.sources import fill_select

# batches into each table of the `merge_scaling` step (its figure: their medians), after
# one untimed batch into each: the first MERGEs of a session compile Spark's and
# Iceberg's code, which would weigh on whichever table goes first
MERGE_ROUNDS = 5


class ScalingSteps:
    """Steps of `cdclake_bench.runner.Bench` (which gives `sizes`, `work`, `stack`,
    `figures`, `details`, `say`, `session` and `spark`)."""

    def merge_scaling(self) -> None:
        """A batch of `merge_batch` changes on random keys MERGEd into a table of each
        size: both tables filled first, then `MERGE_ROUNDS` batches into each, small and
        big alternating (each batch new offsets, new keys); the figure is the ratio of
        their medians, so one slow second on a shared machine does not decide it. One
        untimed batch into each table first."""
        batch = self.sizes.merge_batch
        tables = {rows: self._filled_table(rows) for rows in self.sizes.merge_rows}
        walls: dict[int, list[float]] = {rows: [] for rows in tables}
        for i in range(MERGE_ROUNDS + 1):
            for rows, pipeline in tables.items():
                wall = self._merge_batch(pipeline, rows, batch, i)
                if i:
                    walls[rows].append(wall)
        for pipeline in tables.values():
            self.spark.sql(f"DROP TABLE {pipeline.qualified_target(pipeline.tables[0])} PURGE")
        median = {rows: statistics.median(w) for rows, w in walls.items()}
        small, big = sorted(median)
        self.figures["merge_scaling_ratio"] = median[big] / median[small]
        self.details["merge_scaling"] = {
            "batch": batch,
            **{f"rows_{r}_s": m for r, m in median.items()},
            "walls_s": {str(r): w for r, w in walls.items()},
        }

    # ---- Iceberg v3 deletion vectors against v2 position deletes --------------------------
    def deletes_v3(self) -> None:
        """The big table of `merge_scaling` in format v2 and in v3 (whose MERGEs write
        deletion vectors): `v3_batches` batches of `merge_batch` changes into each,
        alternating (the figure: the ratio of their medians, v2 over v3), then a full scan
        of each (v2 over v3), and the same scan after `cdclake maintain`."""
        from cdclake.iceberg.maintenance import run_maintenance

        rows, batch = self.sizes.merge_rows[1], self.sizes.merge_batch
        tables = {v: self._filled_table(rows, {"format-version": str(v)}) for v in (2, 3)}
        walls: dict[int, list[float]] = {v: [] for v in tables}
        for i in range(self.sizes.v3_batches):
            for v, pipeline in tables.items():
                walls[v].append(self._merge_batch(pipeline, rows, batch, i))
        scans = {v: {"after_batches_s": self._full_scan(p)} for v, p in tables.items()}
        for v, pipeline in tables.items():
            run_maintenance(pipeline, self.spark)
            scans[v]["after_maintenance_s"] = self._full_scan(pipeline)
            self.spark.sql(f"DROP TABLE {pipeline.qualified_target(pipeline.tables[0])} PURGE")
        median = {v: statistics.median(w) for v, w in walls.items()}
        self.figures["v3_write_ratio"] = median[2] / median[3]
        self.figures["v3_read_ratio"] = scans[2]["after_batches_s"] / scans[3]["after_batches_s"]
        self.details["deletes_v3"] = {"rows": rows, "batch": batch, "median_s": median,
                                      "walls_s": walls, "scans_s": scans}  # fmt: skip
        self.say(f"v2 / v3: batches {median[2]:.2f} / {median[3]:.2f} s; scans "
                 f"{scans[2]} / {scans[3]}")  # fmt: skip

    def _full_scan(self, pipeline) -> float:
        """The wall of reading every live row of the table whole (its deletes applied; a
        hash of each row, which no file statistics can answer)."""
        table = pipeline.qualified_target(pipeline.tables[0])
        started = time.perf_counter()
        self.spark.sql(f"SELECT sum(xxhash64(*)) FROM {table}").collect()
        return time.perf_counter() - started

    def _filled_table(self, rows: int, properties: dict[str, str] | None = None):
        """A new table of `rows` rows (keys 1..rows), with these table properties: its
        pipeline."""
        from cdclake_bench.sources import generated_reader

        tag = uuid.uuid4().hex[:6]
        seed = Workload(10, 10, Workload.standard(1, 1, f"benchm{tag}", tables=1).streams, 1)
        pipeline = bench_pipeline(self.work, self.stack.s, seed, f"merge{rows}",
                                  table_properties=properties)  # fmt: skip
        spark = self.session(pipeline)
        ranges = tuple(OffsetRange(t, p, 0, n) for t, p, n in seed.slices())
        run_batch(spark, pipeline, BatchPlan(pipeline.name, "seed", ranges),
                  read=generated_reader(seed))  # fmt: skip
        table = pipeline.qualified_target(pipeline.tables[0])
        self.say(f"filling {table} with {rows:,} rows")
        spark.sql(f"INSERT INTO {table} {fill_select(spark, table, rows)}")
        return pipeline

    def _merge_batch(self, pipeline, rows: int, batch: int, round_: int) -> float:
        """The wall of the `round_`th batch of `batch` changes on random keys of 1..rows."""
        from cdclake_bench.sources import generated_reader

        (stream,) = Workload.standard(1, 1, pipeline.topic_prefix, tables=1).streams
        change = Workload(batch, rows, (stream,), 1)
        start = 10 + round_ * batch  # new offsets: new keys, and not a batch loaded already
        ranges = tuple(OffsetRange(t, p, start, start + n) for t, p, n in change.slices())
        started = time.perf_counter()
        run_batch(self.spark, pipeline, BatchPlan(pipeline.name, f"change-{round_}", ranges),
                  read=generated_reader(change))  # fmt: skip
        wall = time.perf_counter() - started
        self.say(f"{batch:,} changes into {rows:,} rows: {wall:.1f}s")
        return wall
