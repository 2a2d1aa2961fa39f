"""Airflow-only code of cdclake: the DAG factory and the task callables. The core package
(`cdclake`) never imports Airflow; DAG files import this package."""
