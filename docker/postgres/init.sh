#!/bin/bash
# First start of the PostgreSQL container: the demo source database, the Airflow metadata
# database, and the Debezium signal table.
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" <<SQL
CREATE DATABASE inventory;
CREATE USER airflow WITH PASSWORD '${AIRFLOW_DB_PASSWORD}';
CREATE DATABASE airflow OWNER airflow;
SQL
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname inventory \
  -f /docker-entrypoint-initdb.d/inventory.sql.src
