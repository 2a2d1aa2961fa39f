"""`cdclake_backfill`, `cdclake_snapshot` and `cdclake_dead_letters`: manually triggered,
with Params forms."""

from cdclake_airflow.manual import build_manual_dags

globals().update(build_manual_dags())
