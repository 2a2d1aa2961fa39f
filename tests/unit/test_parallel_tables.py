"""The driver-side fan-out of a batch's tables: order, failures, naming."""

import threading
import time
from pathlib import Path

import pytest
from cdclake.batch import LoadStatus, TableResult
from cdclake.config import CatalogConfig, KafkaConfig, PipelineConfig, TableConfig
from cdclake.exceptions import CommitConflictError
from cdclake.job import _run_tables

PIPELINE = PipelineConfig(
    name="p", path=Path("p.yaml"), topic_prefix="pg", kafka=KafkaConfig("k:9092"),
    catalog=CatalogConfig("lake", "jdbc", "jdbc:postgresql://h/c", "file:///w"),
    namespace="ns", tables=tuple(TableConfig(f"public.t{i}", f"t{i}") for i in range(5)),
)  # fmt: skip


def load_factory(fail: dict[str, Exception], delays: dict[str, float] | None = None):
    threads: set[str] = set()

    def load(table: TableConfig) -> TableResult:
        threads.add(threading.current_thread().name)
        time.sleep((delays or {}).get(table.target, 0.05))  # busy while the rest are submitted
        if table.target in fail:
            raise fail[table.target]
        return TableResult(table=table.target, topic=table.source, status=LoadStatus.COMMITTED)

    return load, threads


@pytest.mark.parametrize("threads", [1, 3, 8])  # inline, fewer threads than tables, more
def test_results_keep_the_tables_order_whatever_finishes_first(threads):
    delays = {"t0": 0.2, "t1": 0.1}  # the first tables finish last
    load, used = load_factory({}, delays)
    results = _run_tables(list(PIPELINE.tables), load, threads, PIPELINE)
    assert [r.table for r in results] == ["t0", "t1", "t2", "t3", "t4"]
    assert len(used) == min(threads, 5)


def test_a_failed_table_does_not_stop_the_others_and_the_first_is_raised_by_name():
    done: list[str] = []
    load, _ = load_factory({"t3": RuntimeError("boom"), "t1": CommitConflictError("late")})

    def recording(table):
        result = load(table)
        done.append(table.target)
        return result

    with pytest.raises(CommitConflictError) as failed:
        _run_tables(list(PIPELINE.tables), recording, 2, PIPELINE)
    # cdclake errors keep their type and gain the table's name and the other failures
    assert str(failed.value) == "lake.ns.t1: late (also failed: lake.ns.t3)"
    assert sorted(done) == ["t0", "t2", "t4"]


def test_an_error_naming_its_topic_is_kept_and_others_get_a_note():
    named = CommitConflictError("pg.public.t2 partition 0 offset 5: bad")
    load, _ = load_factory({"t2": named})
    with pytest.raises(CommitConflictError) as failed:
        _run_tables(list(PIPELINE.tables), load, 4, PIPELINE)
    assert failed.value is named
    load, _ = load_factory({"t4": ValueError("plain")})
    with pytest.raises(ValueError) as failed:
        _run_tables(list(PIPELINE.tables), load, 4, PIPELINE)
    assert failed.value.__notes__ == ["while loading lake.ns.t4"]
