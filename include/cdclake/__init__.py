"""cdclake: batch loader from Debezium PostgreSQL change events on Kafka into Apache Iceberg."""

__version__ = "0.1.0"
