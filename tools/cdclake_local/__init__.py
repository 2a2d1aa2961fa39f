"""The local default stack: PostgreSQL, Apache Kafka (KRaft), Debezium on Kafka Connect,
an Iceberg JDBC catalog and an AIRFLOW_HOME, all on loopback under one state directory."""

from cdclake.exceptions import CdclakeError


class StackError(CdclakeError):
    """The local stack could not be started, stopped or inspected."""
