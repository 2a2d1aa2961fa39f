from pathlib import Path

import pytest
from cdclake.config import CatalogType, DeleteMode, OnError
from cdclake.debezium.formats import WireFormat
from cdclake.exceptions import ConfigError
from cdclake.pipeline_file import load_pipeline
from cdclake.spark import catalog_spark_conf
from cdclake_control.pipelines import read_pipelines

VALID = """
name: shop
topic_prefix: pg
kafka: {bootstrap_servers: "k1:9092,k2:9092", properties: {security.protocol: SSL}}
catalog: {name: lake, type: jdbc, uri: "jdbc:postgresql://db:5432/cat", warehouse: wh}
namespace: shop
tables:
  - public.orders
  - {source: public.items, target: order_items, key: [order_id, line]}
  - {source: public.audit, exclude: [secret], delete_mode: soft,
     partition_by: ["bucket(16, id)", "days(at)", kind], properties: {a.b: 1}}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


def test_valid_config_parses_into_typed_objects(tmp_path):
    p = load_pipeline(write(tmp_path, VALID))
    assert p.name == "shop"
    assert p.kafka.client_config()["bootstrap.servers"] == "k1:9092,k2:9092"
    assert p.kafka.client_config()["security.protocol"] == "SSL"
    assert p.catalog.warehouse == (tmp_path / "wh").resolve().as_uri()
    assert [t.target for t in p.tables] == ["orders", "order_items", "audit"]
    assert p.tables[1].key == ("order_id", "line")
    assert p.topic_for(p.tables[0]) == "pg.public.orders"
    assert p.qualified_target(p.tables[1]) == "lake.shop.order_items"
    assert p.on_error is OnError.FAIL and p.kafka.format is WireFormat.JSON
    audit = p.tables[2]
    assert audit.exclude == ("secret",) and audit.delete_mode is DeleteMode.SOFT
    assert audit.partition_by == ("bucket(16, id)", "days(at)", "kind")
    assert audit.properties == {"a.b": "1"}
    assert p.max_records_per_batch == 1_000_000
    assert p.parallel_tables == 4


def test_environment_variables_are_interpolated(tmp_path, monkeypatch):
    monkeypatch.setenv("KAFKA_HOSTS", "broker:29092")
    text = VALID.replace('"k1:9092,k2:9092"', '"${KAFKA_HOSTS}"').replace(
        "namespace: shop", "namespace: ${NS_UNSET:-fallback}"
    )
    p = load_pipeline(write(tmp_path, text))
    assert p.kafka.bootstrap_servers == "broker:29092"
    assert p.namespace == "fallback"


@pytest.mark.parametrize(
    "change, field",
    [
        (("name: shop", "name: Shop-1"), "name"),  # bad pipeline name
        (("name: shop\n", ""), "name"),  # missing required field
        (("namespace: shop", "namespace: 3rd"), "namespace"),  # not an identifier
        (("type: jdbc", "type: glue"), "catalog.type"),  # unsupported catalog
        (("  - public.orders", "  - orders"), "tables[0].source"),  # no schema part
        (("key: [order_id, line]", "key: [1]"), "tables[1].key[0]"),  # key not a name
        (("tables:", "max_records_per_batch: 0\ntables:"), "max_records_per_batch"),
        (("tables:", "on_error: ignore\ntables:"), "on_error"),  # not a known mode
        (("tables:", "parallel_tables: 0\ntables:"), "parallel_tables"),  # no table at a time
        (("tables:", "parallel_tables: two\ntables:"), "parallel_tables"),  # not a number
        (("tables:", "colour: blue\ntables:"), "colour"),  # unknown top-level field
        (
            ('bootstrap_servers: "k1:9092,k2:9092"', 'bootstrap_servers: "${NOPE_UNSET}"'),
            "kafka.bootstrap_servers",
        ),  # env var missing without default
        (("target: order_items", "target: orders"), "tables"),  # two sources, one target
        (("delete_mode: soft", "delete_mode: gone"), "tables[2].delete_mode"),
        (("properties: {", "format: protobuf, properties: {"), "kafka.format"),  # no such format
        (("properties: {", "format: avro, properties: {"), "kafka.schema_registry.url"),
        (
            ("properties: {", "schema_registry: {url: 'http://r'}, properties: {"),
            "kafka.schema_registry",
        ),  # not with JSON
        (('"days(at)"', '"days(at); drop table x"'), "tables[2].partition_by[1]"),
        (("exclude: [secret]", "exclude: [id], key: [id]"), "tables[2].exclude"),
        (("delete_mode: soft", "colour: red"), "tables[2].colour"),  # unknown table field
        (("delete_mode: soft", "history_columns: [x]"), "tables[2].history_columns"),  # no history
        (
            ("exclude: [secret]", "exclude: [secret], history: true, history_columns: [secret]"),
            "tables[2].history_columns",
        ),  # excluded
        (
            ("tables:", "connector: {binary_handling_mode: octal}\ntables:"),
            "connector.binary_handling_mode",
        ),  # fmt: skip
        (("tables:", "connector: {speed: fast}\ntables:"), "connector.speed"),
        (("tables:", "source: {signal_table: nodot}\ntables:"), "source.signal_table"),
        (("tables:", "source: {colour: red}\ntables:"), "source.colour"),
        (("tables:", "source: {filter_max_seconds: 0}\ntables:"), "source.filter_max_seconds"),
        (("  - public.orders", "  - public.ord-*"), "tables[0].source"),  # bad glob
        (("  - public.orders", "  - {source: 'public.*', target: x}"), "tables[0].target"),
    ],
)
def test_bad_config_names_file_and_field(tmp_path, change, field):
    old, new = change
    assert old in VALID
    path = write(tmp_path, VALID.replace(old, new))
    with pytest.raises(ConfigError) as err:
        load_pipeline(path)
    assert str(path) in str(err.value)
    assert f": {field}:" in str(err.value)


def test_patterns_add_the_captured_tables_they_match(tmp_path):
    text = VALID.replace(
        "  - public.orders\n",
        "  - public.orders\n  - {source: 'sales.*', delete_mode: soft}\n  - 'arch?ve.log_*'\n",
    )
    p = load_pipeline(write(tmp_path, text))
    assert [t.source for t in p.tables] == ["public.orders", "public.items", "public.audit"]
    assert [t.source for t in p.patterns] == ["sales.*", "arch?ve.log_*"]
    topics = [
        "pg.sales.deals", "pg.sales.refunds", "pg.archive.log_2024", "pg.archive.other",
        "pg.public.orders",  # listed by name: stays as listed
        "pg.message", "pg.transaction", "other.sales.deals", "pg.sales.a.b",  # not tables
    ]  # fmt: skip
    found = p.with_topics(topics)
    assert found.patterns == ()
    assert [t.source for t in found.tables] == [
        "public.orders", "public.items", "public.audit",
        "archive.log_2024", "sales.deals", "sales.refunds",
    ]  # fmt: skip
    deals = found.table_named("sales.deals")
    assert deals.target == "deals" and deals.delete_mode is DeleteMode.SOFT
    assert found.with_topics(["pg.sales.late"]) is found  # found once: no patterns left
    # a table a pattern matches can be named before it is found (backfills, snapshots)
    assert p.table_named("sales.later").target == "later"
    assert p.table_named("nosuch.table") is None


def test_two_tables_landing_in_one_target_through_a_pattern_are_refused(tmp_path):
    text = VALID.replace("  - public.orders\n", "  - public.orders\n  - '*.orders'\n")
    p = load_pipeline(write(tmp_path, text))
    assert [t.source for t in p.with_topics(["pg.public.orders"]).tables][0] == "public.orders"
    with pytest.raises(ConfigError, match="public.orders and sales.orders .* both land in"):
        p.with_topics(["pg.sales.orders"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_pipeline(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_pipeline(write(tmp_path, "name: [unclosed"))


def test_a_directory_of_pipelines_keeps_the_good_ones_and_names_each_broken_file(tmp_path):
    (tmp_path / "a.yaml").write_text(VALID.replace("name: shop", "name: a"))
    (tmp_path / "b.yaml").write_text(VALID.replace("namespace: shop", "namespace: 9x"))
    (tmp_path / "c.yaml").write_text(VALID.replace("name: shop", "name: a"))
    (tmp_path / "d.yaml").write_text(VALID)
    (tmp_path / "notes.txt").write_text("not a pipeline")
    found = read_pipelines(tmp_path)
    assert sorted(found.pipelines) == ["a", "shop"]
    assert found.pipelines["shop"].path == tmp_path / "d.yaml"
    assert list(found.errors) == [tmp_path / "b.yaml", tmp_path / "c.yaml"]
    with pytest.raises(ConfigError) as err:
        found.raise_errors()
    first, second = str(err.value).splitlines()
    assert first.startswith(f"{tmp_path / 'b.yaml'}: namespace:")
    assert second == f"{tmp_path / 'c.yaml'}: name: 'a' is already used by {tmp_path / 'a.yaml'}"
    missing = read_pipelines(tmp_path / "nowhere")
    assert missing.pipelines == {}
    with pytest.raises(ConfigError, match="nowhere: pipelines directory does not exist"):
        missing.raise_errors()
    (tmp_path / "b.yaml").unlink()
    (tmp_path / "c.yaml").unlink()
    read_pipelines(tmp_path).raise_errors()  # nothing broken: nothing raised


def test_demo_pipeline_is_valid():
    root = Path(__file__).resolve().parents[2]
    p = load_pipeline(root / "include" / "pipelines" / "demo.yaml")
    assert {t.source for t in p.tables} >= {"inventory.customers", "inventory.orders"}


def test_spark_submit_carries_only_the_launch_settings(tmp_path, monkeypatch):
    """spark-submit's command line (Airflow logs it, `ps` shows it) carries the settings
    on `LAUNCH_SETTINGS` only: a catalog's password or REST header, a Kafka login given
    as a Spark setting, an object store's key all reach the driver from the pipeline file
    and its environment."""
    import dataclasses

    from cdclake.spark import DRIVER_PYTHON, LAUNCH_SETTINGS, PYTHON, launch_conf, spark_conf

    monkeypatch.setenv("CDCLAKE_CATALOG_PASSWORD", "s3cr3t-value")
    from tests.conftest import DEMO_PIPELINE

    pipeline = load_pipeline(DEMO_PIPELINE)
    own = {"spark.jars": "/jars/x.jar", "spark.driver.memory": "6g",
           "spark.kafka.sasl.jaas.config": "login-secret",
           "spark.sql.catalog.lake.header.Authorization": "Bearer t0ken",
           "spark.hadoop.fs.s3a.access.key": "AKIA-key"}  # fmt: skip
    pipeline = dataclasses.replace(pipeline, spark=dataclasses.replace(pipeline.spark, conf=own))
    full = spark_conf(pipeline)
    assert full["spark.sql.catalog.lake.jdbc.password"] == "s3cr3t-value"  # the driver's session
    submitted = launch_conf(pipeline)
    assert set(submitted) <= LAUNCH_SETTINGS
    assert submitted["spark.driver.memory"] == "6g" and submitted["spark.jars"] == "/jars/x.jar"
    assert {PYTHON, DRIVER_PYTHON} <= set(submitted)
    line = " ".join(f"{k}={v}" for k, v in submitted.items())
    for secret in ("s3cr3t-value", "login-secret", "t0ken", "AKIA-key"):
        assert secret not in line, secret


def test_maintenance_defaults_and_overrides(tmp_path):
    p = load_pipeline(write(tmp_path, VALID))
    assert p.maintenance.enabled and p.maintenance.schedule == "@daily"
    assert p.maintenance.orphan_older_than_hours >= 24
    text = VALID + (
        "maintenance: {schedule: null, retain_last: 3, expire_older_than_hours: 0,\n"
        "  target_file_size_bytes: '${SIZE:-67108864}', min_input_files: 2}\n"
    )
    m = load_pipeline(write(tmp_path, text)).maintenance
    assert m.schedule is None  # manual runs only
    assert (m.retain_last, m.expire_older_than_hours) == (3, 0)
    assert (m.target_file_size_bytes, m.min_input_files) == (67108864, 2)


@pytest.mark.parametrize(
    "section, field, problem",
    [
        ("{retain_last: 0}", "maintenance.retain_last",
         "Input should be greater than or equal to 1"),  # no snapshot left
        ("{orphan_older_than_hours: 1}", "maintenance.orphan_older_than_hours",
         "must be at least 24"),  # younger files may be a committing load's
        ("{expire_older_than_hours: -1}", "maintenance.expire_older_than_hours",
         "Input should be greater than or equal to 0"),
        ("{min_input_files: many}", "maintenance.min_input_files",
         "Input should be a valid integer"),  # not a number
        ("{delete_file_threshold: 0}", "maintenance.delete_file_threshold",
         "Input should be greater than or equal to 1"),
        ("{target_file_size_bytes: 10}", "maintenance.target_file_size_bytes",
         "Input should be greater than or equal to 1048576"),  # < 1 MiB
        ("{enabled: sometimes}", "maintenance.enabled", "Input should be a valid boolean"),
        ("{keep_forever: true}", "maintenance.keep_forever", "unknown key"),
        ("[expire]", "maintenance", "must be a mapping"),  # not a mapping
        ("{serve: 'http://driver:8765'}", "spark.serve", "unknown key"),
        # a pipeline file written for the served driver, which was removed
        ("{served: 'http://driver:8765', conf: {}}", "spark.served",
         "the served driver was removed; loads run through spark-submit"),
    ],
)  # fmt: skip
def test_bad_section_names_file_and_field(tmp_path, section, field, problem):
    path = write(tmp_path, VALID + f"{field.split('.')[0]}: {section}\n")
    with pytest.raises(ConfigError) as err:
        load_pipeline(path)
    assert str(path) in str(err.value)
    assert f": {field}: {problem}" in str(err.value)


@pytest.mark.parametrize(
    "type_line, problem",
    [("type: jdbc", None), ("type: rest", None),  # the two catalogs
     ("type: glue", "catalog.type: Input should be 'jdbc' or 'rest'"),  # not one
     ("type: JDBC", "catalog.type: Input should be 'jdbc' or 'rest'"),  # spelled so
     ("type: ''", "catalog.type: Input should be 'jdbc' or 'rest'"),
     ("type: null", "catalog.type: is required")],  # given as nothing
)  # fmt: skip
def test_the_catalog_type_is_one_of_the_catalogs(tmp_path, type_line, problem):
    path = write(tmp_path, VALID.replace("type: jdbc", type_line))
    if problem is not None:
        with pytest.raises(ConfigError) as err:
            load_pipeline(path)
        assert str(err.value) == f"{path}: {problem}"
        return
    catalog = load_pipeline(path).catalog
    assert catalog.type is CatalogType(type_line.split()[-1])
    # Spark's setting is the plain string
    assert type(catalog_spark_conf(catalog)["spark.sql.catalog.lake.type"]) is str
    assert catalog_spark_conf(catalog)["spark.sql.catalog.lake.type"] == catalog.type.value


@pytest.mark.parametrize(
    "change, problem",
    [(("tables:", "source: {signal_table: nodot}\ntables:"),
      "source.signal_table: 'nodot' must be '<schema>.<table>'"),  # one part
     (("tables:", "source: {signal_table: a.b.c}\ntables:"),
      "source.signal_table: 'a.b.c' must be '<schema>.<table>'"),  # three parts
     (("tables:", "source: {signal_table: 'public.sig*'}\ntables:"),
      "source.signal_table: 'public.sig*' must be '<schema>.<table>'"),  # never a pattern
     (("  - public.orders", "  - orders"),
      "tables[0].source: 'orders' must be '<schema>.<table>'"),  # a table as a string
     (("source: public.items", "source: public.items-2"),
      "tables[1].source: 'public.items-2' must be '<schema>.<table>'"),  # as a mapping
     (("  - public.orders", "  - public.ord-*"),
      "tables[0].source: 'public.ord-*' must be '<schema>.<table>' (a pattern may use * and ?)"),
     (("  - public.orders", "  - 'public.*.x?'"),
      "tables[0].source: 'public.*.x?' must be '<schema>.<table>' (a pattern may use * and ?)")],
)  # fmt: skip
def test_a_source_table_name_is_schema_dot_table(tmp_path, change, problem):
    path = write(tmp_path, VALID.replace(*change))
    with pytest.raises(ConfigError) as err:
        load_pipeline(path)
    assert str(err.value) == f"{path}: {problem}"


def test_a_source_table_may_be_a_pattern_and_the_signal_table_is_kept(tmp_path):
    text = VALID.replace("  - public.orders", "  - 'pub?ic.ord*'").replace(
        "tables:", "source: {signal_table: ops.signals}\ntables:"
    )
    p = load_pipeline(write(tmp_path, text))
    assert [t.source for t in p.patterns] == ["pub?ic.ord*"]
    assert p.source.signal_table == "ops.signals"


def test_the_wire_format_is_read_from_the_kafka_section(tmp_path, monkeypatch):
    text = VALID.replace("properties: {", "format: json, properties: {", 1)
    assert load_pipeline(write(tmp_path, text)).kafka.format is WireFormat.JSON
    with pytest.raises(ConfigError, match=r"kafka.format: Input should be "
                       r"'json', 'json-flat', 'avro' or 'avro-flat'"):  # fmt: skip
        load_pipeline(write(tmp_path, text.replace("format: json", "format: protobuf")))
    monkeypatch.setenv("REGISTRY_LOGIN", "cdc:s3cret")
    avro = text.replace(
        "format: json",
        "format: avro-flat, schema_registry: {url: "
        "'http://registry:8080/apis/ccompat/v7/', user_info: '${REGISTRY_LOGIN}'}",
    )
    kafka = load_pipeline(write(tmp_path, avro)).kafka
    assert kafka.format is WireFormat.AVRO_FLAT
    registry = kafka.schema_registry
    assert (registry.url, registry.user_info) == ("http://registry:8080/apis/ccompat/v7",
                                                  "cdc:s3cret")  # fmt: skip
    assert "s3cret" not in repr(kafka)
    with pytest.raises(ConfigError, match="kafka.schema_registry.url: .* without a login"):
        load_pipeline(write(tmp_path, avro.replace("http://", "http://u:p@")))


def test_cached_rows_are_kept_unencoded_unless_the_pipeline_says(tmp_path):
    from cdclake.spark import spark_conf

    key = "spark.sql.inMemoryColumnarStorage.compressed"
    assert spark_conf(load_pipeline(write(tmp_path, VALID)))[key] == "false"
    text = VALID + f"spark:\n  conf:\n    {key}: 'true'\n"
    assert spark_conf(load_pipeline(write(tmp_path, text)))[key] == "true"


LONG_NAME = "p" * 101


@pytest.mark.parametrize(
    "old, new, expected",
    [
        pytest.param(
            "bootstrap_servers:", "bootstrp_servers:",
            "kafka.bootstrp_servers: unknown key (did you mean 'bootstrap_servers'?",
            id="misspelt required key",
        ),
        pytest.param(
            "properties: {security.protocol: SSL}", "propertes: {security.protocol: SSL}",
            "kafka.propertes: unknown key (known: bootstrap_servers, format, properties, "
            "schema_registry)",
            id="misspelt optional key under kafka",
        ),
        pytest.param(
            "warehouse: wh}", "warehouse: wh, credential: x}",
            "catalog.credential: unknown key (known: name, properties, type, uri, warehouse)",
            id="unknown key under catalog",
        ),
        pytest.param(
            "namespace: shop\n", "namespace: shop\nnamespace: other\n",
            "namespace: duplicate key (lines 6 and 7)",
            id="duplicate top-level key",
        ),
        pytest.param(
            'kafka: {bootstrap_servers: "k1:9092,k2:9092",',
            'kafka: {bootstrap_servers: "k1:9092,k2:9092", bootstrap_servers: "k3:9092",',
            "kafka.bootstrap_servers: duplicate key (lines 4 and 4)",
            id="duplicate key in a flow mapping",
        ),
        pytest.param(
            "key: [order_id, line]}", "key: [order_id, line], key: [id]}",
            "tables[1].key: duplicate key (lines 9 and 9)",
            id="duplicate key in a table entry",
        ),
        pytest.param(
            "tables:", "schedule: every 5 minutes\ntables:",
            "schedule: 'every 5 minutes' is not a cron expression",
            id="schedule in words",
        ),
        pytest.param(
            "tables:", "schedule: '61 * * * *'\ntables:",
            "schedule: '61 * * * *' is not a cron expression",
            id="minute out of range",
        ),
        pytest.param(
            "tables:", "schedule: '@fortnightly'\ntables:",
            "schedule: '@fortnightly' is not a cron expression",
            id="no such preset",
        ),
        pytest.param(
            "tables:", "maintenance: {schedule: daily}\ntables:",
            "maintenance.schedule: 'daily' is not a cron expression",
            id="maintenance schedule",
        ),
        pytest.param(
            "topic_prefix: pg", "topic_prefix: ''",
            "topic_prefix: must not be empty",
            id="empty topic prefix",
        ),
        pytest.param(
            "topic_prefix: pg", "topic_prefix: '${PREFIX_UNSET:-}'",
            "topic_prefix: must not be empty",
            id="topic prefix empty after interpolation",
        ),
        pytest.param(
            '"k1:9092,k2:9092"', '"${KAFKA_UNSET:-} "',
            "kafka.bootstrap_servers: must not be empty",
            id="no bootstrap servers",
        ),
        pytest.param(
            "warehouse: wh}", "warehouse: ''}",
            "catalog.warehouse: must not be empty",
            id="empty warehouse (read as the config's directory)",
        ),
        pytest.param(
            "target: order_items", "target: ''",
            "tables[1].target: must not be empty",
            id="empty target of a table listed by name",
        ),
        pytest.param(
            "target: order_items", "target: '${TARGET_UNSET:-}'",
            "tables[1].target: must not be empty",
            id="target empty after interpolation",
        ),
        pytest.param(
            "topic_prefix: pg", "topic_prefix: pg/main",
            "topic_prefix: 'pg/main' must be",
            id="slash in topic prefix",
        ),
        pytest.param(
            "topic_prefix: pg", "topic_prefix: '..'",
            "topic_prefix: '..' must be",
            id="topic prefix Kafka reserves",
        ),
        pytest.param(
            "name: shop", f"name: {LONG_NAME}",
            f"name: '{LONG_NAME}' must be lower-case letters, digits and underscores (at most 100)",
            id="name too long for a DAG id",
        ),
        pytest.param(
            "tables:",
            "connector: {binary_handling_mode: hex, binary.handling.mode: bytes}\ntables:",
            "connector.binary.handling.mode: give connector.binary_handling_mode or",
            id="one mode in both spellings",
        ),
    ],
)  # fmt: skip
def test_strict_keys_schedules_and_topic_prefix(tmp_path, old, new, expected):
    assert VALID.count(old) == 1
    path = write(tmp_path, VALID.replace(old, new))
    with pytest.raises(ConfigError) as err:
        load_pipeline(path)
    assert f"{path}: {expected}" in str(err.value)


def test_a_topic_prefix_may_use_every_character_kafka_allows(tmp_path):
    p = load_pipeline(write(tmp_path, VALID.replace("topic_prefix: pg", "topic_prefix: P.g_1-x")))
    assert p.topic_for(p.tables[0]) == "P.g_1-x.public.orders"


def test_known_keys_are_the_fields_of_the_section(tmp_path):
    """The list of known keys comes from the config classes' fields, every section's."""
    path = write(tmp_path, VALID + "colour: blue\n")
    with pytest.raises(ConfigError) as err:
        load_pipeline(path)
    known = str(err.value).split("(known: ")[1].rstrip(")").split(", ")
    assert {"name", "kafka", "timeouts", "maintenance", "connector", "topic_prefix"} <= set(known)
    path = write(tmp_path, VALID + "timeouts: {connect: 5}\n")
    with pytest.raises(ConfigError, match=r"timeouts.connect: unknown key \(known: connect_s"):
        load_pipeline(path)


@pytest.mark.parametrize(
    "schedule",
    ["null", "'@once'", "'@continuous'", "'@hourly'", "'@daily'", "'@quarterly'", "'@yearly'",
     "'*/5 * * * *'", "'0 6 * * MON-FRI'", "'0 0 L * *'", "'*/30 * * * * *'"],
)  # fmt: skip
def test_schedules_airflow_accepts_are_accepted(tmp_path, schedule):
    text = VALID + f"schedule: {schedule}\nmaintenance: {{schedule: {schedule}}}\n"
    p = load_pipeline(write(tmp_path, text))
    expected = None if schedule == "null" else schedule.strip("'")
    assert p.schedule == expected and p.maintenance.schedule == expected


def test_schedule_shape_is_checked_without_croniter(monkeypatch):
    import sys

    from cdclake.config_fields import schedule_problem

    monkeypatch.setitem(sys.modules, "croniter", None)  # import croniter raises ImportError
    assert schedule_problem("*/5 * * * *") is None
    assert schedule_problem("@daily") is None
    assert "5 fields" in schedule_problem("every 5 minutes")
    assert "5 fields" in schedule_problem("* * * *")


def test_yaml_anchors_merges_and_dotted_modes_are_not_duplicates(tmp_path):
    text = VALID.replace("tables:", "x-defaults: &d {delete_mode: soft}\ntables:", 1)
    with pytest.raises(ConfigError, match=": x-defaults: unknown key"):
        load_pipeline(write(tmp_path, text))
    text = (
        VALID.replace(
            "  - public.orders\n",
            "  - &o {source: public.orders, delete_mode: soft}\n"
            "  - {<<: *o, source: public.returns}\n",
        )
        + "connector: {decimal.handling.mode: string}\n"
    )
    p = load_pipeline(write(tmp_path, text))
    assert [(t.source, t.delete_mode) for t in p.tables[:2]] == [
        ("public.orders", DeleteMode.SOFT), ("public.returns", DeleteMode.SOFT),
    ]  # fmt: skip
    assert p.connector.decimal_handling_mode == "string"


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "soon"])
def test_snapshot_timeout_must_be_positive_before_anything_is_sent(timeout):
    import subprocess
    import sys

    from tests.conftest import DEMO_PIPELINE

    out = subprocess.run(
        [sys.executable, "-m", "cdclake", "snapshot", "--pipeline", str(DEMO_PIPELINE),
         "--table", "inventory.orders", "--source-dsn", "host=127.0.0.1 port=1 dbname=x",
         "--timeout", timeout],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert f"argument --timeout: {timeout!r} is not a number of seconds > 0" in out.stderr


def test_watch_takes_its_connection_and_names_the_pipelines_topics(tmp_path):
    p = load_pipeline(write(tmp_path, VALID))
    assert p.watch is None
    text = VALID.replace("  - public.orders\n", "  - public.orders\n  - {source: 'sales.o?d*'}\n")
    p = load_pipeline(write(tmp_path, text + "watch: {}\n"))
    assert p.watch.conn_id == "cdclake_kafka"
    topics = p.watched_topics()
    assert topics[:3] == ["pg.public.orders", "pg.public.items", "pg.public.audit"]
    assert topics[3] == r"^pg\.sales\.o[^.]d[^.]*$"
    p = load_pipeline(write(tmp_path, VALID + "watch: {conn_id: kafka_shop}\n"))
    assert p.watch.conn_id == "kafka_shop"


@pytest.mark.parametrize(
    "extra, expected",
    [
        ("watch: {conn: x}\n", "watch.conn: unknown key (known: conn_id)"),
        ("watch: yes\n", "watch: "),
        ("schedule: '@once'\nwatch: {}\n", "watch: cannot be combined with schedule '@once'"),
    ],
)
def test_a_bad_watch_is_refused_naming_it(tmp_path, extra, expected):
    path = write(tmp_path, VALID + extra)
    with pytest.raises(ConfigError) as err:
        load_pipeline(path)
    assert f"{path}: {expected}" in str(err.value)


def test_a_snapshot_filters_cost_is_bounded_by_a_setting(tmp_path):
    assert load_pipeline(write(tmp_path, VALID)).source.filter_max_seconds == 600
    text = VALID.replace("tables:", "source: {filter_max_seconds: 2.5}\ntables:")
    assert load_pipeline(write(tmp_path, text)).source.filter_max_seconds == 2.5


def test_every_problem_of_a_file_is_reported_one_line_each(tmp_path):
    text = VALID.replace("name: shop", "name: Shop").replace("delete_mode: soft", "colour: red")
    path = write(tmp_path, text + "parallel_tables: 0\nmaintenance: {retain_last: true}\n")
    with pytest.raises(ConfigError) as err:
        load_pipeline(path)
    assert str(err.value).splitlines() == [
        f"{path}: name: 'Shop' must be lower-case letters, digits and underscores (at most 100)",
        f"{path}: tables[2].colour: unknown key (known: delete_mode, exclude, history, "
        "history_columns, key, partition_by, properties, source, target)",
        f"{path}: parallel_tables: Input should be greater than 0",
        f"{path}: maintenance.retain_last: must be a whole number, got True",  # no 1
    ]


@pytest.mark.parametrize(
    "old, new, expected",
    [
        pytest.param(
            "namespace: shop",
            "namespace: shop\npath: /elsewhere.yaml",
            "path: unknown key (known: catalog, connector, consistency, consistent_tags_hours,",
            id="the file's own path",
        ),
        pytest.param(
            "tables:",
            "patterns: ['sales.*']\ntables:",
            "patterns: unknown key",
            id="patterns, which come from tables",
        ),
        pytest.param(
            "warehouse: wh}",
            "warehouse: wh, timeouts: {connect_s: 1}}",
            "catalog.timeouts: unknown key (known: name, properties, type, uri, warehouse)",
            id="a section's timeouts, which are the pipeline's",
        ),
        pytest.param(
            "properties: {security",
            "format: avro, schema_registry: {url: 'http://r', timeout_s: 1}, properties: {security",
            "kafka.schema_registry.timeout_s: unknown key (known: url, user_info)",
            id="the registry's timeout, which is the pipeline's request_s",
        ),
    ],
)
def test_fields_the_pipeline_fills_in_are_not_read_from_the_file(tmp_path, old, new, expected):
    assert VALID.count(old) == 1
    path = write(tmp_path, VALID.replace(old, new))
    with pytest.raises(ConfigError) as err:
        load_pipeline(path)
    assert f"{path}: {expected}" in str(err.value)


@pytest.mark.parametrize(
    "old, new, expected",
    [
        pytest.param(
            "  - public.orders\n",
            "  - 7\n",
            "tables[0]: must be a string '<schema>.<table>' or a mapping",
            id="a number",
        ),
        pytest.param(
            "  - public.orders\n",
            "  - [public.orders]\n",
            "tables[0]: must be a string '<schema>.<table>' or a mapping",
            id="a list",
        ),
        pytest.param(
            "  - public.orders\n",
            "  - {source: 7}\n",
            "tables[0].source: '7' must be '<schema>.<table>'",
            id="a number as a source",
        ),
        pytest.param(
            "tables:\n", "tables: []\nx-tables:\n", "tables: must not be empty", id="no table"
        ),
    ],
)
def test_a_table_is_listed_by_name_or_as_a_mapping(tmp_path, old, new, expected):
    assert VALID.count(old) == 1
    path = write(tmp_path, VALID.replace(old, new))
    with pytest.raises(ConfigError) as err:
        load_pipeline(path)
    assert f"{path}: {expected}" in str(err.value)
