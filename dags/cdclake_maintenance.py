"""The `cdclake_maintenance` DAG: Iceberg maintenance of every pipeline in include/pipelines/."""

from cdclake_airflow.maintenance import build_maintenance_dags

globals().update(build_maintenance_dags())
