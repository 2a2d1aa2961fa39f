"""Running DAGs of the dags folder with `dag.test()` and reading what they returned; a
token from a real api-server."""

from __future__ import annotations

import json


def run_dag(dag_id: str, conf: dict | None = None, state: str = "success"):
    """Run a DAG of the dags folder with `dag.test()`; check the run ends in `state`."""
    from airflow.dag_processing.dagbag import DagBag

    from tests.conftest import ROOT

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert not bag.import_errors, bag.import_errors
    run = bag.dags[dag_id].test(run_conf=conf)
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert str(run.state) == state, states
    return run


def task_states(run) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def xcom_of(run, task_id: str, key: str = "return_value"):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        value = session.scalar(
            select(XComModel.value).where(
                XComModel.dag_id == run.dag_id,
                XComModel.run_id == run.run_id,
                XComModel.task_id == task_id,
                XComModel.key == key,
            )
        )
    while isinstance(value, str) and value[:1] in ('"', "{", "["):
        try:
            value = json.loads(value)
        except ValueError:
            break
    return value


def asset_events(run) -> dict[str, dict]:
    """The asset events a DAG run emitted, as Airflow's metadata DB holds them: asset
    name -> the event's extra (a run emits at most one per asset)."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(AssetModel.name, AssetEvent.extra)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetEvent.source_dag_id == run.dag_id, AssetEvent.source_run_id == run.run_id)
        ).all()
    names = [name for name, _ in rows]
    assert len(names) == len(set(names)), f"more than one event for an asset: {names}"
    return dict(rows)
