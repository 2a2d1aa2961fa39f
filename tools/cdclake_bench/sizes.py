"""How big each benchmark step is: the full benchmark, a scale of it, the smoke test's."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

from cdclake_bench.peers import HANDLER_BATCH


@dataclass(frozen=True)
class Sizes:
    """How big each step is. `at_scale(1)` is the full benchmark; the report carries the
    sizes used, since the size-ratio figures (MERGE scaling, memory) depend on them."""

    events: int  # throughput and peers: recorded events
    keys: int
    tables: int
    kafka_events: int
    kafka_keys: int
    fixed_events: int  # spark-submit overhead: a small batch over many tables
    fixed_tables: int
    merge_rows: tuple[int, int]  # table sizes, small and big
    merge_batch: int
    memory_events: tuple[int, int]  # batch sizes, small and big
    memory_keys: int
    capture_rows: int
    peer_batch: int  # events a pydbzengine handler call gets (the engine's max.batch.size)
    peer_seconds: int  # the handler peer stops after the call that passes this
    v3_batches: int  # batches into each of the v2 and v3 tables of `deletes_v3`
    fresh_rate: int  # `freshness`: source changes a second
    fresh_seconds: int  # how long each mode's workload writes
    fresh_keys: int
    fresh_warm_seconds: int  # `freshness`: the Spark Connect server's warm-up writes

    @classmethod
    def at_scale(cls, scale: float) -> Sizes:
        def n(full: int, least: int = 10) -> int:
            return max(least, int(full * scale))

        return cls(
            events=n(1_000_000), keys=n(250_000, 4), tables=3,
            kafka_events=n(100_000), kafka_keys=n(25_000, 4),
            fixed_events=100, fixed_tables=10,
            merge_rows=(n(100_000, 100), n(10_000_000, 1000)), merge_batch=n(10_000),
            memory_events=(n(1_000_000), n(10_000_000)), memory_keys=n(250_000, 4),
            capture_rows=n(20_000, 200), peer_batch=HANDLER_BATCH, peer_seconds=60,
            v3_batches=n(50, 3), fresh_rate=2000, fresh_seconds=n(600, 30),
            fresh_keys=n(20_000, 100), fresh_warm_seconds=30,
        )  # fmt: skip

    @classmethod
    def smoke(cls) -> Sizes:
        """Every step at the smallest size that still has all kinds of events: for the
        test suite (correctness of the figures' code paths, not their values)."""
        return cls(
            events=300, keys=40, tables=1, kafka_events=40, kafka_keys=10,
            fixed_events=10, fixed_tables=1, merge_rows=(100, 1000), merge_batch=20,
            memory_events=(50, 500), memory_keys=10, capture_rows=20, peer_batch=64,
            peer_seconds=600, v3_batches=2, fresh_rate=50, fresh_seconds=20, fresh_keys=100,
            fresh_warm_seconds=0,
        )  # fmt: skip

    def replace(self, overrides: dict[str, str]) -> Sizes:
        """Sizes with some fields set from text (`merge_rows=1000,100000`)."""
        values = {}
        for name, text in overrides.items():
            if name not in self.__dataclass_fields__:
                raise ValueError(f"unknown size {name!r}; known: {', '.join(asdict(self))}")
            parts = tuple(int(float(x)) for x in text.split(","))
            current = getattr(self, name)
            if isinstance(current, tuple) != (len(parts) > 1) or (
                isinstance(current, tuple) and len(parts) != len(current)
            ):
                raise ValueError(f"size {name!r} takes {current!r}-shaped values, got {text!r}")
            values[name] = parts if isinstance(current, tuple) else parts[0]
        return dataclasses.replace(self, **values)
