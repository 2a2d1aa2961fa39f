"""The pipeline configs' check: an Airflow DAG file that defines no DAG.

A broken file in include/pipelines/ (its config refused, or a DAG Airflow would refuse)
gets no DAG while every other pipeline's DAGs load as always; this file then fails to
import with a ConfigError naming each broken file and field, which the Airflow UI lists
among its DAG import errors.
"""

from cdclake_airflow.factory import build_pipeline_dag
from cdclake_airflow.isolation import raise_pipeline_errors
from cdclake_airflow.maintenance import maintenance_dag

raise_pipeline_errors([build_pipeline_dag, maintenance_dag])
