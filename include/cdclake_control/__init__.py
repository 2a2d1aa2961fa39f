"""cdclake's control side: the `cdclake` command, planning a batch, reports and freshness,
incremental-snapshot signals, backfills and the lake-to-source comparison.

It runs where Airflow's tasks and the command run, never in a Spark executor: the loader
(`cdclake`) never imports it, so shipping `cdclake` alone to the executors is enough.
"""
