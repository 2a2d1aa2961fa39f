"""The local default stack: PostgreSQL, Apache Kafka (KRaft), Debezium on Kafka Connect,
an Iceberg JDBC catalog and an AIRFLOW_HOME, all on loopback under one state directory."""
