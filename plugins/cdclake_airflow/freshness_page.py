"""The lake freshness page: a FastAPI app the Airflow api-server mounts at /cdclake.

Every route requires what Airflow's own REST API requires: a valid JWT (the
`Authorization: Bearer` header, or the `_token` cookie the Airflow UI holds after login)
checked by the configured auth manager. A pipeline is listed only when the user may read
its `cdclake__<pipeline>` DAG. The figures come from `cdclake.freshness` (Iceberg
snapshots and Kafka watermarks); the last run state from Airflow's metadata database.
"""

from __future__ import annotations

import datetime as dt
import html
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep
from airflow.models.dagrun import DagRun
from cdclake.config import read_pipelines
from cdclake.exceptions import CdclakeError
from cdclake.freshness import (
    COLUMNS,
    TableFreshness,
    format_time,
    freshness_cells,
    pipeline_freshness,
)
from fastapi import FastAPI, HTTPException, status
from fastapi.responses import HTMLResponse
from sqlalchemy import select

log = logging.getLogger(__name__)

URL_PREFIX = "/cdclake"


@dataclass
class PipelineView:
    name: str
    dag_id: str
    last_run: dict[str, Any] | None = None
    tables: list[TableFreshness] = field(default_factory=list)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dag_id": self.dag_id,
            "last_run": self.last_run,
            "error": self.error,
            "tables": [t.to_dict() for t in self.tables],
        }


def _last_run(session, dag_id: str) -> dict[str, Any] | None:
    run = session.scalars(
        select(DagRun).where(DagRun.dag_id == dag_id).order_by(DagRun.run_after.desc()).limit(1)
    ).first()
    if run is None:
        return None

    def iso(value: dt.datetime | None) -> str | None:
        return value.isoformat() if value else None

    return {
        "run_id": run.run_id,
        "state": str(run.state) if run.state else None,
        "run_after": iso(run.run_after),
        "end_date": iso(run.end_date),
    }


def _readable(user, dag_id: str) -> bool:
    return get_auth_manager().is_authorized_dag(
        method="GET", details=DagDetails(id=dag_id), user=user
    )


def collect(user, session, now_ms: int) -> list[PipelineView]:
    """Every pipeline whose DAG the user may read, a failing one carrying its error, then
    each config file that could not be read, with its error.

    403 when there are pipelines but the user may read none of their DAGs.
    """
    found = read_pipelines()
    out = []
    for pipeline in found.pipelines.values():
        dag_id = f"cdclake__{pipeline.name}"
        if not _readable(user, dag_id):
            continue
        view = PipelineView(pipeline.name, dag_id, _last_run(session, dag_id))
        try:
            view.tables = pipeline_freshness(pipeline, now_ms)
        except CdclakeError as exc:
            log.warning("freshness of pipeline %s: %s", pipeline.name, exc)
            view.error = str(exc)
        out.append(view)
    if found.pipelines and not out:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "no access to any cdclake pipeline DAG")
    # a broken config has no DAG to check access by; its error says what to fix
    out += [PipelineView(name=path.stem, dag_id="", error=str(exc))
            for path, exc in found.errors.items()]  # fmt: skip
    return out


app = FastAPI(title="cdclake freshness", docs_url=None, redoc_url=None, openapi_url=None)


@app.get("/freshness.json")
def freshness_json(user: GetUserDep, session: SessionDep) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    views = collect(user, session, now_ms)
    return {"generated_at_ms": now_ms, "pipelines": [v.to_dict() for v in views]}


@app.get("/freshness", response_class=HTMLResponse)
def freshness_page(user: GetUserDep, session: SessionDep) -> HTMLResponse:
    now_ms = int(time.time() * 1000)
    return HTMLResponse(render_page(collect(user, session, now_ms), now_ms))


# --- HTML -------------------------------------------------------------------------------

_NUMERIC = {"offsets behind", "behind source", "rows"}

_CSS = """
:root { color-scheme: light; --fg:#1f2933; --muted:#616e7c; --line:#e4e7eb; --head:#f5f7fa;
        --ok:#0e7c3a; --okbg:#e3f9e5; --warn:#8d2b0b; --warnbg:#fff3c4; --bad:#a61b1b;
        --badbg:#ffe3e3; --run:#0b4f8a; --runbg:#dceefb; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI",
       Roboto, "Helvetica Neue", Arial, sans-serif; color: var(--fg); background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; }
.sub { color: var(--muted); margin: 0 0 24px; }
section { margin: 0 0 28px; }
h2 { font-size: 16px; margin: 0 0 8px; display: flex; gap: 10px; align-items: center; }
h2 .dag, h2 .when { font-weight: 400; color: var(--muted); font-size: 13px; }
table { border-collapse: collapse; width: 100%; }
th, td { padding: 7px 12px; border-bottom: 1px solid var(--line); text-align: left;
         white-space: nowrap; }
th { background: var(--head); font-weight: 600; font-size: 12px; text-transform: uppercase;
     letter-spacing: .03em; color: var(--muted); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.table { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
td.batch { color: var(--muted); font-size: 12px; max-width: 340px; overflow: hidden;
           text-overflow: ellipsis; }
.pill { display: inline-block; padding: 1px 9px; border-radius: 10px; font-size: 12px;
        font-weight: 600; }
.ok { color: var(--ok); background: var(--okbg); }
.behind { color: var(--warn); background: var(--warnbg); }
.bad { color: var(--bad); background: var(--badbg); }
.running { color: var(--run); background: var(--runbg); }
.none { color: var(--muted); background: var(--head); }
.error { color: var(--bad); background: var(--badbg); padding: 10px 12px; border-radius: 6px;
         white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 12px; }
.legend { color: var(--muted); font-size: 12px; margin-top: 24px; max-width: 900px; }
"""

_RUN_CLASS = {
    "success": "ok",
    "failed": "bad",
    "running": "running",
    "queued": "running",
}


def _run_badge(last_run: dict[str, Any] | None) -> str:
    if last_run is None:
        return '<span class="pill none">no runs yet</span>'
    state = last_run["state"] or "unknown"
    css = _RUN_CLASS.get(state, "none")
    badge = f'<span class="pill {css}">last run: {html.escape(state)}</span>'
    when = last_run["end_date"] or last_run["run_after"]
    if when:
        ms = int(dt.datetime.fromisoformat(when).timestamp() * 1000)
        badge += f' <span class="when">{html.escape(format_time(ms))}</span>'
    return f'<span title="{html.escape(last_run["run_id"], quote=True)}">{badge}</span>'


def _row(t: TableFreshness) -> str:
    cells = freshness_cells(t)
    tds = []
    for name, value in zip(COLUMNS, cells, strict=True):
        css = "num" if name in _NUMERIC else name.replace(" ", "-")
        text = html.escape(value)
        if name == "offsets behind":
            pill = "behind" if t.offsets_behind else "ok"
            text = f'<span class="pill {pill}">{text}</span>'
        tds.append(f'<td class="{css}">{text}</td>')
    return "<tr>" + "".join(tds) + "</tr>"


def _section(v: PipelineView) -> str:
    head = (
        f"<h2>{html.escape(v.name)} <span class='dag'>{html.escape(v.dag_id)}</span> "
        f"{_run_badge(v.last_run) if v.dag_id else ''}</h2>"
    )
    if v.error:
        return f'<section>{head}<div class="error">{html.escape(v.error)}</div></section>'
    ths = "".join(
        f'<th class="{"num" if c in _NUMERIC else ""}">{html.escape(c)}</th>' for c in COLUMNS
    )
    rows = "".join(_row(t) for t in v.tables)
    table = f"<table><thead><tr>{ths}</tr></thead><tbody>{rows}</tbody></table>"
    return f"<section>{head}{table}</section>"


_LEGEND = (
    "<b>last commit</b>: when the Iceberg snapshot holding the table's committed offsets was "
    "written. <b>offsets behind</b>: records Kafka holds past them. <b>behind source</b>: 0 "
    "when nothing waits, else the age of the newest change the table holds. <b>rows</b>: "
    "live rows from Iceberg's snapshot summary (records minus position deletes). "
    "<b>batch</b>: the run that committed the offsets."
)


def render_page(views: list[PipelineView], now_ms: int) -> str:
    body = "".join(_section(v) for v in views) or "<p>No pipelines.</p>"
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        "<meta http-equiv='refresh' content='60'>"
        f"<title>Lake freshness</title><style>{_CSS}</style></head><body>"
        "<h1>Lake freshness</h1>"
        f"<p class='sub'>As of {html.escape(format_time(now_ms))} · refreshes every minute · "
        "<a href='freshness.json'>JSON</a></p>"
        f"{body}<p class='legend'>{_LEGEND}</p></body></html>"
    )
