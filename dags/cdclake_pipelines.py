"""One `cdclake__<pipeline>` DAG per file in include/pipelines/ (plan -> load -> report)."""

from cdclake_airflow.factory import build_pipeline_dags

globals().update(build_pipeline_dags())
