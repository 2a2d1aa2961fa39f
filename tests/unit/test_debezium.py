import pytest
from cdclake.debezium.connect import decimal_params, lake_type, parse_connect_schema
from cdclake.exceptions import DecodeError


def field(kind, name=None, **params):
    schema = {"type": kind, "optional": True, "field": "c"}
    if name:
        schema["name"] = name
    if params:
        schema["parameters"] = params
    return parse_connect_schema(schema)


@pytest.mark.parametrize(
    "schema, stored",
    [
        (field("int16"), "int"),  # smallint widens to Iceberg int
        (field("int32"), "int"),
        (field("int64"), "bigint"),
        (field("float"), "float"),
        (field("double"), "double"),
        (field("boolean"), "boolean"),
        (field("string"), "string"),
        (field("bytes"), "binary"),  # base64 text decoded to bytes
        (
            field(
                "bytes",
                "org.apache.kafka.connect.data.Decimal",
                scale="2",
                **{"connect.decimal.precision": "10"},
            ),
            "decimal(10,2)",
        ),
        (field("int32", "io.debezium.time.Date"), "date"),
        (field("int64", "io.debezium.time.MicroTimestamp"), "timestamp_ntz"),
        (field("int64", "io.debezium.time.Timestamp"), "timestamp_ntz"),
        (field("string", "io.debezium.time.ZonedTimestamp"), "timestamp"),
        (field("int64", "io.debezium.time.MicroTime"), "string"),
        (field("string", "io.debezium.data.Json"), "string"),
        (field("string", "io.debezium.data.Uuid"), "string"),
    ],
)
def test_types(schema, stored):
    assert lake_type(schema) == stored


def test_array_of_dates_decodes_its_elements():
    schema = parse_connect_schema(
        {
            "type": "array",
            "field": "days",
            "items": {"type": "int32", "name": "io.debezium.time.Date"},
        }
    )
    assert lake_type(schema) == "array<date>"


def test_decimal_wider_than_iceberg_is_rejected_with_a_remedy():
    schema = field(
        "bytes",
        "org.apache.kafka.connect.data.Decimal",
        scale="2",
        **{"connect.decimal.precision": "50"},
    )
    with pytest.raises(DecodeError, match="decimal.handling.mode=string"):
        decimal_params(schema)


def test_unknown_connect_type_is_an_error_naming_the_field():
    with pytest.raises(DecodeError, match="'c'"):
        lake_type(field("int128"))
