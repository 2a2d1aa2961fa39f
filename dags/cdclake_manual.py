"""`cdclake_backfill` and `cdclake_snapshot`: manually triggered, with Params forms."""

from cdclake_airflow.manual import build_manual_dags

globals().update(build_manual_dags())
