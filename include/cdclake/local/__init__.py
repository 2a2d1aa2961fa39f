"""The local default stack: PostgreSQL, the tansu broker, the Debezium capture process,
an Iceberg JDBC catalog and an AIRFLOW_HOME, all on loopback under one state directory."""
