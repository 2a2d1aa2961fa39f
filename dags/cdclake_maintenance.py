"""A `cdclake_maintenance__<pipeline>` DAG per file in include/pipelines/ (Iceberg maintenance)."""

from cdclake_airflow.maintenance import build_maintenance_dags

globals().update(build_maintenance_dags())
