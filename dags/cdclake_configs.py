"""The pipeline configs' check: an Airflow DAG file that defines no DAG.

A broken file in include/pipelines/ gets no DAG while every other pipeline's DAGs load as
always; this file then fails to import with a ConfigError naming each broken file and
field, which the Airflow UI lists among its DAG import errors.
"""

from cdclake.config import read_pipelines

read_pipelines().raise_errors()
