"""The load job on the local stack: PostgreSQL, Kafka, Debezium on Kafka Connect, Spark, Iceberg."""

from __future__ import annotations

import dataclasses

import pytest
from cdclake.exceptions import CommitConflictError, EndpointError
from cdclake.iceberg.catalog import load_catalog
from cdclake.job import run_batch
from cdclake.offsets import BatchPlan, OffsetRange
from cdclake.placement import MEASURED, Placement
from cdclake_control.catalog import table_state
from cdclake_control.compare import compare_pipeline
from cdclake_control.planner import plan_pipeline
from cdclake_local.workload import apply_workload

pytestmark = pytest.mark.integration


def snapshot_ids(pipeline):
    cat = load_catalog(pipeline.catalog)
    out = {}
    for t in pipeline.tables:
        try:
            snap = cat.load_table((pipeline.namespace, t.target)).current_snapshot()
        except Exception:
            snap = None
        out[t.target] = snap.snapshot_id if snap else None
    return out


def load_until_caught_up(spark, pipeline, batch_prefix: str):
    plan = plan_pipeline(pipeline, f"{batch_prefix}-1")
    results = run_batch(spark, pipeline, plan)
    return plan, results


def test_loads_changes_equal_to_source_and_resumes(stack, pipeline, spark):
    apply_workload(stack.source_dsn)
    stack.wait_for_capture()
    plan, results = load_until_caught_up(spark, pipeline, "it-a")
    assert plan.ranges and all(r.status == "committed" for r in results)
    diffs = [r for r in compare_pipeline(pipeline, stack.source_dsn) if not r.equal]
    assert not diffs, [(d.source, d.missing[:3], d.extra[:3]) for d in diffs]

    # nothing new: the next plan is empty because offsets come back from the tables
    assert plan_pipeline(pipeline, "it-a-2").ranges == ()

    # offsets committed with the data equal the ends of what was read
    cat = load_catalog(pipeline.catalog)
    for table in pipeline.tables:
        state = table_state(cat, pipeline, table)
        for r in plan.ranges:
            if r.topic == pipeline.topic_for(table):
                assert state.offsets[(r.topic, r.partition)] == r.end


def test_replaying_a_committed_plan_changes_nothing(stack, pipeline, spark):
    apply_workload(stack.source_dsn)
    stack.wait_for_capture()
    plan = plan_pipeline(pipeline, "it-b")
    assert plan.ranges
    run_batch(spark, pipeline, plan)
    before = snapshot_ids(pipeline)
    again = run_batch(spark, pipeline, plan)  # an Airflow retry of the same load task
    assert {r.status for r in again} == {"already_committed"}
    assert snapshot_ids(pipeline) == before


def test_stale_plan_is_refused_without_writing(stack, pipeline, spark):
    apply_workload(stack.source_dsn)
    stack.wait_for_capture()
    plan = plan_pipeline(pipeline, "it-c")
    run_batch(spark, pipeline, plan)
    before = snapshot_ids(pipeline)
    r = plan.ranges[0]
    stale = BatchPlan(
        pipeline.name, "it-c-stale", (OffsetRange(r.topic, r.partition, 0, r.end - 1),)
    )
    with pytest.raises(CommitConflictError, match="another run loaded this table"):
        run_batch(spark, pipeline, stale)
    assert snapshot_ids(pipeline) == before


def test_unreachable_kafka_is_named(pipeline):
    broken = dataclasses.replace(
        pipeline, kafka=dataclasses.replace(pipeline.kafka, bootstrap_servers="127.0.0.1:9")
    )
    with pytest.raises(EndpointError, match=r"127\.0\.0\.1:9"):
        plan_pipeline(broken)


def test_unreachable_catalog_is_named(pipeline):
    uri = "jdbc:postgresql://127.0.0.1:9/cdclake_catalog"
    broken = dataclasses.replace(pipeline, catalog=dataclasses.replace(pipeline.catalog, uri=uri))
    with pytest.raises(EndpointError, match="127.0.0.1:9/cdclake_catalog"):
        plan_pipeline(broken)


def test_offsets_for_a_time_are_found_by_bisecting_records(stack, pipeline):
    import uuid

    from cdclake_control.watermarks import fetch_watermarks, offsets_for_time
    from confluent_kafka import Producer

    topic = f"it_times_{uuid.uuid4().hex[:6]}"
    producer = Producer(pipeline.kafka.client_config())
    for i in range(10):  # record i carries time (i + 1) * 1000
        producer.produce(topic, value=b"x", partition=0, timestamp=(i + 1) * 1000)
        producer.flush(10)
    marks = {tp: m for tp, m in fetch_watermarks(pipeline.kafka, [topic]).items() if m.high}
    assert {tp: (m.low, m.high) for tp, m in marks.items()} == {(topic, 0): (0, 10)}
    for ts, offset in [(0, 0), (1000, 0), (3500, 3), (4000, 3), (10000, 9), (10001, 10)]:
        assert offsets_for_time(pipeline.kafka, marks, ts) == {(topic, 0): offset}, ts


def test_a_topic_recreated_behind_the_committed_offsets_fails_as_data_loss(stack, spark, tmp_path):
    """The broker lost the records the table's offsets point past (the topic was deleted
    and created again): planning fails naming topic, partition and offsets."""
    import uuid

    from cdclake.exceptions import DataLossError
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.debezium_records import key_record, value_record
    from tests.integration.helpers import make_pipeline

    n = uuid.uuid4().hex[:6]
    pipeline = make_pipeline(tmp_path, f"it_gone_{n}", [f"public.gone_{n}"])
    topic = pipeline.topic_for(pipeline.tables[0])
    config = pipeline.kafka.client_config()
    admin = AdminClient(config)
    producer = Producer(config)

    def produce(ids):
        for i in ids:
            item = {"id": i, "name": f"n{i}", "price": None, "day": None, "at": None,
                    "at_tz": None, "blob": None}  # fmt: skip
            producer.produce(topic, key=key_record(i), value=value_record("c", None, item))
            producer.flush(10)

    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    produce(range(5))
    results = run_batch(spark, pipeline, plan_pipeline(pipeline, "gone-1"))
    assert [r.offsets for r in results] == [{topic: {"0": 5}}]

    admin.delete_topics([topic])[topic].result(30)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    produce(range(100, 102))
    with pytest.raises(
        DataLossError,
        match=rf"{topic} partition 0: the last committed offset 5 is beyond the end of the "
        r"partition \(2\).*rebuild",
    ):
        plan_pipeline(pipeline, "gone-2")


def test_the_driver_reads_what_the_executors_read(stack, spark, tmp_path):
    """Small batches are read by the driver, big ones by Spark tasks range by range: both
    read the same raw rows from the real broker, and a load range by range also ends
    with the lake equal to the source."""
    import uuid

    from cdclake.kafka.reader import KAFKA, range_plan, read_local
    from cdclake.raw_rows import RAW_SCHEMA

    from tests.integration.helpers import assert_lake_equals_source, load_all, make_pipeline

    apply_workload(stack.source_dsn)
    stack.wait_for_capture()
    name = f"it_read_{uuid.uuid4().hex[:6]}"
    tables = ["inventory.customers", "inventory.orders", "inventory.type_zoo"]
    pipeline = make_pipeline(tmp_path, name, tables)
    plan = plan_pipeline(pipeline, f"{name}-0")  # a new namespace: everything from the start
    assert len(plan.ranges) == 3 and all(r.size for r in plan.ranges)

    local = read_local(pipeline.kafka, plan.ranges)
    reader = KAFKA.open(pipeline.kafka)

    def read(batches):
        for batch in batches:
            for r in batch.to_pylist():
                yield from reader(r)

    frame = range_plan(spark, plan.ranges).mapInArrow(read, RAW_SCHEMA)
    order = ["topic", "partition", "offset"]
    assert local.sort_by([(c, "ascending") for c in order]).to_pylist() == [
        r.asDict() for r in frame.orderBy(*order).collect()
    ]
    assert local.num_rows == sum(r.size for r in plan.ranges)

    results = load_all(stack, spark, pipeline, name, "ranges")
    assert {r.status for r in results} == {"committed"}
    assert_lake_equals_source(pipeline, stack.source_dsn)


def first_load_table(stack, tmp_path, name: str):
    """A new source table with a few live rows, a deleted one and an update, captured."""
    import uuid

    import psycopg

    from tests.integration.helpers import make_pipeline

    n = uuid.uuid4().hex[:6]
    table = f"inventory.{name}_{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {table} (id int primary key, v text)")
        conn.execute(f"insert into {table} select i, 'v' || i from generate_series(1, 6) i")
        conn.execute(f"delete from {table} where id = 2")
        conn.execute(f"update {table} set v = 'w' where id = 3")
    stack.wait_for_capture()
    return make_pipeline(tmp_path, f"it_{name}_{n}", [table])


def test_a_first_load_appends_then_batches_merge(stack, spark, tmp_path):
    import psycopg

    from tests.integration.helpers import assert_lake_equals_source

    pipeline = first_load_table(stack, tmp_path, "first")
    results = run_batch(spark, pipeline, plan_pipeline(pipeline, "it-first-1"))
    assert [(r.status, r.written_by) for r in results] == [("committed", "append")]
    assert_lake_equals_source(pipeline, stack.source_dsn)
    source = pipeline.tables[0].source
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"update {source} set v = 'x' where id in (1, 4)")
        conn.execute(f"delete from {source} where id = 5")
    stack.wait_for_capture()
    results = run_batch(spark, pipeline, plan_pipeline(pipeline, "it-first-2"))
    assert [(r.status, r.written_by) for r in results] == [("committed", "merge")]
    assert_lake_equals_source(pipeline, stack.source_dsn)


def test_a_commit_between_the_read_and_a_first_load_fails_the_load(
    stack, spark, tmp_path, monkeypatch
):
    """Another run's rows committed after this batch found the table empty: appending
    would put a key in twice, so the commit is refused and nothing of the batch lands."""
    import cdclake.iceberg.write

    pipeline = first_load_table(stack, tmp_path, "raced")
    target = pipeline.qualified_target(pipeline.tables[0])
    ensure_table = cdclake.iceberg.write.ensure_table

    def and_another_writer(spark, table, *args, **kwargs):
        columns = ensure_table(spark, table, *args, **kwargs)
        if table == target:
            given = {"id": "1", "v": "'other run'"}
            values = [given.get(f.name, f"CAST(NULL AS {f.dataType.simpleString()})")
                      for f in spark.table(table).schema.fields]  # fmt: skip
            spark.sql(f"INSERT INTO {table} SELECT {', '.join(values)}")
        return columns

    monkeypatch.setattr(cdclake.iceberg.write, "ensure_table", and_another_writer)
    with pytest.raises(CommitConflictError, match="another run wrote to this table"):
        run_batch(spark, pipeline, plan_pipeline(pipeline, "it-raced-1"))
    rows = spark.sql(f"SELECT id, v FROM {target}").collect()
    assert [(r.id, r.v) for r in rows] == [(1, "other run")]


@pytest.mark.parametrize("other", ["rows", "offsets"])
def test_a_commit_between_the_read_and_a_merge_fails_the_batch(stack, spark, tmp_path,
                                                               monkeypatch, other):  # fmt: skip
    """Another commit reached the table after this batch read its offsets (rows of other
    keys, or only offsets, as a run with nothing to write commits): the batch's MERGE is
    committed to a branch that main does not take, so nothing of the batch lands and the
    table's offsets stay the other commit's. Its branch goes; another load's stays."""
    import cdclake.iceberg.write
    import psycopg
    from cdclake.iceberg.tables import commit_empty, current_snapshot, load_iceberg_table

    pipeline = first_load_table(stack, tmp_path, f"merged_{other}")
    run_batch(spark, pipeline, plan_pipeline(pipeline, f"it-merged-{other}-1"))
    target = pipeline.qualified_target(pipeline.tables[0])
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"update {pipeline.tables[0].source} set v = 'x' where id = 1")
    stack.wait_for_capture()
    ensure_table = cdclake.iceberg.write.ensure_table
    theirs = {}

    def and_another_writer(spark, table, *args, **kwargs):
        columns = ensure_table(spark, table, *args, **kwargs)
        if table == target and not theirs:
            if other == "rows":
                given = {"id": "99", "v": "'other run'"}
                values = [given.get(f.name, f"CAST(NULL AS {f.dataType.simpleString()})")
                          for f in spark.table(table).schema.fields]  # fmt: skip
                spark.sql(f"INSERT INTO {table} SELECT {', '.join(values)}")
            else:
                commit_empty(spark, table, {"cdclake.offsets": current_snapshot(
                    spark, table)[1]["cdclake.offsets"], "marker": "other run"})  # fmt: skip
            theirs.update(current_snapshot(spark, table)[1])
        return columns

    monkeypatch.setattr(cdclake.iceberg.write, "ensure_table", and_another_writer)
    # another load's branch (at work, or a killed load's): this load leaves it alone
    other = load_iceberg_table(spark, target)
    other.manageSnapshots().createBranch("cdclake_load_1_other", current_snapshot(
        spark, target)[0]).commit()  # fmt: skip
    with pytest.raises(CommitConflictError, match="another commit reached the table after"):
        run_batch(spark, pipeline, plan_pipeline(pipeline, f"it-merged-{other}-2"))
    assert current_snapshot(spark, target)[1] == theirs
    assert spark.sql(f"SELECT v FROM {target} WHERE id = 1").collect()[0].v == "v1"
    refs = spark.sql(f"SELECT name FROM {target}.refs").collect()
    assert sorted(r.name for r in refs) == ["cdclake_load_1_other", "main"]


def test_an_append_to_an_empty_table_checks_every_commit_after_its_snapshot(stack, spark):
    """`append_to_empty` given the snapshot at which the table held no row: it commits
    while nothing came after, and refuses once another commit added rows."""
    import uuid

    from cdclake.iceberg.tables import (
        append_to_empty,
        commit_empty,
        conflicts_reported,
        current_snapshot,
        ensure_namespace,
    )

    namespace = f"lake.it_append_{uuid.uuid4().hex[:6]}"
    ensure_namespace(spark, namespace)
    table = f"{namespace}.t"
    spark.sql(f"CREATE TABLE {table} (id int, v string) USING iceberg")
    commit_empty(spark, table, {"marker": "empty"})
    empty_id, _ = current_snapshot(spark, table)
    append_to_empty(spark, table, "SELECT 1 AS id, 'a' AS v", empty_id)
    with pytest.raises(CommitConflictError, match="refused"), conflicts_reported("refused"):
        append_to_empty(spark, table, "SELECT 2 AS id, 'b' AS v", empty_id)
    assert [(r.id, r.v) for r in spark.table(table).collect()] == [(1, "a")]


@pytest.mark.parametrize("delete_mode", ["hard", "soft"])
def test_a_first_load_appends_what_a_merge_would_write(stack, spark, tmp_path, monkeypatch,
                                                       delete_mode):  # fmt: skip
    """The same first batch into a new table: resolved range by range and appended,
    resolved in the driver and appended, and MERGEd. The same rows, every column (deleted
    keys kept with their flag in soft mode), and the same ledger."""
    from cdclake.iceberg.deleted_keys import deleted_keys_table

    from tests.integration.helpers import make_pipeline, stray_files

    pipeline = first_load_table(stack, tmp_path, f"same_{delete_mode}")
    source = pipeline.tables[0].source
    tables = {}
    for way in ("ranges", "append", "merge"):
        tuning = dataclasses.replace(MEASURED, first_load_append=way != "merge")
        name = f"{pipeline.name}_{way}"
        each = make_pipeline(tmp_path, name, [{"source": source, "delete_mode": delete_mode}])
        placement = Placement.RANGES if way == "ranges" else Placement.AUTO
        results = run_batch(spark, each, plan_pipeline(each, f"it-same-{way}"),
                            placement=placement, tuning=tuning)  # fmt: skip
        assert [r.written_by for r in results] == ["merge" if way == "merge" else "append"]
        target = each.qualified_target(each.tables[0])
        ledger = deleted_keys_table(target)
        tables[way] = (
            sorted(tuple(r) for r in spark.table(target).collect()),
            sorted(tuple(r) for r in spark.table(ledger).collect())
            if spark.catalog.tableExists(ledger) else None,
        )  # fmt: skip
        assert stray_files(spark, target) == []
    assert tables["ranges"] == tables["append"] == tables["merge"]
    rows, ledger = tables["ranges"]
    assert len(rows) == (6 if delete_mode == "soft" else 5)
    assert (ledger is not None) == (delete_mode == "hard")


def test_a_first_load_resolved_by_range_holds_every_type_and_takes_later_merges(
    stack, spark, tmp_path, monkeypatch
):
    """A first load resolved range by range and appended: the type zoo's columns the lake
    maps to a scalar column, equal in the lake as PostgreSQL compares them; their files'
    metrics let a filter skip them; then updates and deletes MERGEd into those files."""
    import uuid

    import psycopg
    from cdclake_control.compare import compare_table

    from tests.integration.helpers import make_pipeline, stray_files

    columns = (
        "c_bool, c_bit1, c_bit8, c_varbit, c_int2, c_int4, c_int8, c_real, c_double, c_num, "
        "c_num_free, c_money, c_char, c_varchar, c_text, c_ts0, c_ts3, c_ts6, c_tstz, c_date, "
        "c_time, c_time0, c_timetz, c_interval, c_bytea, c_json, c_jsonb, c_xml, c_uuid, "
        "c_ltree, c_citext, c_inet, c_cidr, c_macaddr, c_macaddr8, c_int4range, c_int8range, "
        "c_numrange, c_tsrange, c_tstzrange, c_daterange, c_enum, c_domain, c_big_text"
    )
    n = uuid.uuid4().hex[:6]
    source = f"inventory.zoo_files_{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {source} as select id, {columns} from inventory.type_zoo "
                     "where id < 100")  # fmt: skip
        conn.execute(f"alter table {source} add primary key (id)")
        conn.execute(f"insert into {source} select id + 1000, {columns} from {source}")
    stack.wait_for_capture()
    pipeline = make_pipeline(tmp_path, f"it_zoo_files_{n}", [source])
    table = pipeline.tables[0]
    target = pipeline.qualified_target(table)
    results = run_batch(spark, pipeline, plan_pipeline(pipeline, "it-zoo-files-1"),
                        placement=Placement.RANGES)  # fmt: skip
    assert [(r.resolved_by, r.written_by) for r in results] == [("ranges", "append")]
    assert compare_table(pipeline, table, stack.source_dsn).equal
    assert stray_files(spark, target) == []
    # the footers' metrics: a filter on the key skips files whose bounds exclude it
    plan = spark.sql(f"SELECT * FROM {target} WHERE id = -5").collect()
    assert plan == []
    bounds = spark.sql(f"SELECT count(*) AS n FROM {target}.files "
                       "WHERE lower_bounds IS NULL OR upper_bounds IS NULL").first()  # fmt: skip
    assert bounds.n == 0

    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"update {source} set c_num = -c_num, c_text = c_text || ' ✓', "
                     "c_tstz = c_tstz + interval '1 microsecond' where id > 1000")  # fmt: skip
        conn.execute(f"delete from {source} where id = (select min(id) from {source})")
    stack.wait_for_capture()
    results = run_batch(spark, pipeline, plan_pipeline(pipeline, "it-zoo-files-2"),
                        placement=Placement.RANGES)  # fmt: skip
    assert [r.written_by for r in results] == ["merge"]
    assert compare_table(pipeline, table, stack.source_dsn).equal


def test_a_batch_reads_the_ledger_of_its_own_keys_only(spark):
    """`with_deleted_lsn` gives each resolved row the highest LSN at which an earlier
    batch deleted its key, grouping only the ledger's rows of the batch's keys: a
    ledger holds a row per delete ever loaded (against 10M ledger rows a 10,000-key
    batch's took 0.7-1.0 s instead of 6.7-9.6 s, docs/performance.md)."""
    import uuid

    from cdclake.iceberg.deleted_keys import deleted_keys_table, with_deleted_lsn
    from cdclake.iceberg.merge_sql import DELETED_AT
    from pyspark.sql.types import LongType, StructField, StructType

    n = uuid.uuid4().hex[:6]
    spark.sql("create namespace if not exists lake.it_ledger")
    table = f"lake.it_ledger.t_{n}"
    ledger = deleted_keys_table(table)
    spark.sql(f"create table {ledger} (id bigint not null, _cdc_lsn bigint not null) using iceberg")
    spark.sql(f"insert into {ledger} values (1, 10), (1, 30), (2, 20), (3, 50), (1, 25)")
    keyed = StructType([StructField("id", LongType()), StructField("_cdc_lsn", LongType())])
    resolved = spark.createDataFrame([(1, 40), (2, 21), (4, 5), (None, 7)], keyed)
    schema = type("Keyed", (), {"key_names": ("id",)})()
    found = with_deleted_lsn(spark, table, resolved, schema)
    assert {r["id"]: r[DELETED_AT] for r in found.collect()} == {1: 30, 2: 20, 4: None,
                                                                  None: None}  # fmt: skip
    plan = found._jdf.queryExecution().optimizedPlan().toString()
    assert "LeftSemi" in plan, plan


def test_a_batch_appends_its_deleted_keys_to_the_ledger_from_its_resolved_rows(spark):
    """`record_deleted_keys` appends the batch's deleted keys with their LSN, from the
    resolved rows (the MERGE's source joins the ledger; the append needs none of it),
    creating the ledger on the first delete and keeping the rows it held."""
    import uuid
    from types import SimpleNamespace

    from cdclake.iceberg.deleted_keys import deleted_keys_table, record_deleted_keys
    from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

    n = uuid.uuid4().hex[:6]
    spark.sql("create namespace if not exists lake.it_ledger")
    table = f"lake.it_ledger.r_{n}"
    ledger = deleted_keys_table(table)
    schema = SimpleNamespace(key=(SimpleNamespace(name="id", type="bigint"),
                                  SimpleNamespace(name="k.ind", type="string")))  # fmt: skip
    fields = [StructField("id", LongType()), StructField("k.ind", StringType()),
              StructField("v", StringType()), StructField("_cdc_deleted", BooleanType()),
              StructField("_cdc_lsn", LongType())]  # fmt: skip
    rows = [(1, "a", None, True, 40), (2, "a", "kept", False, 41), (3, "b", None, True, None),
            (4, "b", None, True, 44)]  # fmt: skip
    record_deleted_keys(spark, table, spark.createDataFrame(rows, StructType(fields)), schema)
    later = [(1, "a", None, True, 60), (5, "c", "kept", False, 61)]
    record_deleted_keys(spark, table, spark.createDataFrame(later, StructType(fields)), schema)
    held = spark.sql(f"select id, `k.ind`, _cdc_lsn from {ledger}").collect()
    assert sorted(tuple(r) for r in held) == [(1, "a", 40), (1, "a", 60), (4, "b", 44)]


def test_a_changed_table_setting_is_applied_and_a_changed_delete_mode_refused(
    stack, spark, tmp_path
):
    """Editing a table's `properties` or `partition_by` in the pipeline reaches the
    existing Iceberg table with the next load (a property set, partition fields dropped
    and added); a `delete_mode` other than the table's is refused before anything is
    written, naming the setting."""

    import psycopg
    from cdclake.exceptions import ConfigError
    from cdclake.iceberg.tables import load_iceberg_table, table_state

    from tests.integration.helpers import assert_lake_equals_source, load_all, make_pipeline

    source, name = _new_source(stack, "settings", "id int primary key, kind text, v text",
                               "i, 'k' || (i % 3), 'v' || i", 20)  # fmt: skip

    def pipeline(**table):
        return make_pipeline(tmp_path, name, [{"source": source, **table}])

    sizes = {"write.target-file-size-bytes": "2000000", "owner.team": "x", "format-version": "2"}

    first = pipeline(partition_by=["bucket(4, id)", "kind"],
                     properties={"write.target-file-size-bytes": "1000000"})  # fmt: skip
    load_all(stack, spark, first, f"{name}-1")
    target = first.qualified_target(first.tables[0])
    assert [f[1:] for f in table_state(spark, target).partition_fields] == [
        ("bucket[4]", "id"), ("identity", "kind")]  # fmt: skip

    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"update {source} set v = 'changed' where id <= 5")
    edited = pipeline(partition_by=["kind", "truncate(2, v)"], properties=sizes)
    load_all(stack, spark, edited, f"{name}-2")
    state = table_state(spark, target)
    assert [f[1:] for f in state.partition_fields] == [("identity", "kind"), ("truncate[2]", "v")]
    assert state.properties["write.target-file-size-bytes"] == "2000000"
    assert state.properties["owner.team"] == "x"
    assert_lake_equals_source(edited, stack.source_dsn)

    # a property the file no longer names is unset (or set back to cdclake's own value);
    # one set some other way stays
    spark.sql(f"ALTER TABLE {target} SET TBLPROPERTIES ('owner.note'='kept')")
    steps = [({"write.target-file-size-bytes": "2000000", "write.merge.mode": "copy-on-write"},
              {"write.target-file-size-bytes": "2000000", "write.merge.mode": "copy-on-write",
               "owner.team": None, "owner.note": "kept"}),
             ({}, {"write.target-file-size-bytes": None, "write.merge.mode": "merge-on-read",
                   "owner.note": "kept"})]  # fmt: skip
    for i, (properties, expected) in enumerate(steps):
        with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
            conn.execute(f"update {source} set v = 'again {i}' where id <= 5")
        step = pipeline(partition_by=["kind", "truncate(2, v)"], properties=properties)
        load_all(stack, spark, step, f"{name}-p{i}")
        held = table_state(spark, target).properties
        assert {k: held.get(k) for k in expected} == expected, i
    assert_lake_equals_source(step, stack.source_dsn)
    spec_id = load_iceberg_table(spark, target).spec().specId()

    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"delete from {source} where id = 1")
    soft = pipeline(partition_by=["kind", "truncate(2, v)"], delete_mode="soft", properties=sizes)
    before = table_state(spark, target)
    stack.wait_for_capture()
    with pytest.raises(ConfigError, match="delete_mode is soft, but the table was created with "
                                          "hard deletes"):  # fmt: skip
        run_batch(spark, soft, plan_pipeline(soft, f"{name}-3"))
    after = table_state(spark, target)
    assert (after.snapshot_id, after.committed) == (before.snapshot_id, before.committed)
    assert load_iceberg_table(spark, target).spec().specId() == spec_id


def test_the_identifier_fields_follow_a_new_primary_key(stack, spark, tmp_path, caplog):
    """A new primary key in the source moves the table's identifier fields to it when its
    columns are required in the table (a narrower key); a key with a column that may hold
    NULL in the table (the lake creates every column but the key's optional, and Iceberg
    cannot make one required) has the old identifier fields dropped, with a warning,
    rather than left naming a key the table no longer has. The lake equals the source
    throughout."""
    import logging

    import psycopg
    from cdclake.iceberg.tables import load_iceberg_table

    from tests.integration.helpers import assert_lake_equals_source, load_all, make_pipeline

    source, name = _new_source(stack, "rekey", "id int, code text, v text, primary key (id, code)",
                               "i, 'c' || i, 'v' || i", 10)  # fmt: skip
    pipeline = make_pipeline(tmp_path, name, [{"source": source}])
    target = pipeline.qualified_target(pipeline.tables[0])

    def identifier_fields() -> set[str]:
        return set(load_iceberg_table(spark, target).schema().identifierFieldNames())

    load_all(stack, spark, pipeline, f"{name}-1")
    assert identifier_fields() == {"id", "code"}

    bare = source.split(".")[1]
    for i, key in enumerate(["id", "id, v"]):
        with psycopg.connect(stack.source_dsn) as conn:
            conn.execute(f"alter table {source} drop constraint {bare}_pkey")
            conn.execute(f"alter table {source} add primary key ({key})")
        with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
            conn.execute(f"update {source} set v = 'again {i}' where id <= 4")
            conn.execute(f"insert into {source} values ({20 + i}, 'new {i}', 'w')")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="cdclake.iceberg.tables"):
            load_all(stack, spark, pipeline, f"{name}-k{i}")
        assert_lake_equals_source(pipeline, stack.source_dsn)
        dropped = [r.getMessage() for r in caplog.records if "were dropped" in r.getMessage()]
        if i == 0:  # `id` was a key column, so required in the table
            assert identifier_fields() == {"id"}
            assert not dropped
        else:  # `v` was created optional
            assert identifier_fields() == set()
            assert len(dropped) == 1 and "old identifier fields ['id'] were dropped" in dropped[0]


def _new_source(stack, stem: str, columns: str, values: str, rows: int) -> tuple[str, str]:
    """A new source table `inventory.<stem>_<n>` (`columns`: its DDL) holding `rows` rows
    (`values`: a select list over `i` from 1), and a pipeline name for it."""
    import uuid

    import psycopg

    n = uuid.uuid4().hex[:6]
    source, name = f"inventory.{stem}_{n}", f"it_{stem}_{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {source} ({columns})")
        conn.execute(f"insert into {source} select {values} from generate_series(1, {rows}) i")
    return source, name


@pytest.mark.parametrize("kind", ["tinyint", "smallint", "int", "bigint"])
def test_a_key_filter_is_written_in_its_columns_type(spark, kind):
    """Spark reads each value of a MERGE's key filter as a literal of the key column's
    type: no cast of each of them to plan, and the same rows pass."""
    from cdclake.debezium.schema import Column, TopicSchema
    from cdclake.iceberg.merge_sql import key_filter_sql

    key = Column("k", kind, False)
    condition = key_filter_sql(TopicSchema(key=(key,), columns=(key,)), {"k": [-3, 7, 100]})
    spark.sql(f"SELECT CAST(k AS {kind}) AS k FROM VALUES (-3), (5), (100) AS v(k)") \
        .createOrReplaceTempView("key_filter_t")  # fmt: skip
    df = spark.sql(f"SELECT k FROM key_filter_t t WHERE true {condition}")
    filtered = df._jdf.queryExecution().analyzed().toString().split("Filter", 1)[1]
    assert "cast" not in filtered.split("\n", 1)[0].lower()
    assert sorted(r.k for r in df.collect()) == [-3, 100]
