"""The lake freshness page: a FastAPI app the Airflow api-server mounts at /cdclake.

Every route requires what Airflow's own REST API requires: a valid JWT (the
`Authorization: Bearer` header, or the `_token` cookie the Airflow UI holds after login)
checked by the configured auth manager. A pipeline is listed only when the user may read
its `cdclake__<pipeline>` DAG. The figures come from `cdclake_control.freshness` (Iceberg
snapshots and Kafka watermarks); whether the DAG is active, paused or missing and its last
run from Airflow's metadata database (two queries for all pipelines). Links go to the
Airflow UI's pages of the DAG and of its last run.
"""

from __future__ import annotations

import datetime as dt
import html
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep
from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from cdclake.exceptions import CdclakeError
from cdclake_control.freshness import (
    COLUMNS,
    TableFreshness,
    format_time,
    freshness_cells,
    pipeline_freshness,
)
from cdclake_control.pipelines import read_pipelines
from fastapi import FastAPI, HTTPException, status
from fastapi.responses import HTMLResponse
from sqlalchemy import func, select

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

URL_PREFIX = "/cdclake"


class DagState(StrEnum):
    """What Airflow knows of a pipeline's load DAG."""

    ACTIVE = "active"  # parsed and scheduled
    PAUSED = "paused"  # parsed, but the scheduler starts no runs
    MISSING = "missing"  # never parsed, or its file no longer defines it (stale)


def dag_path(dag_id: str) -> str:
    """The Airflow UI's page of a DAG (a path under the UI's root)."""
    return f"/dags/{quote(dag_id, safe='')}"


def run_path(dag_id: str, run_id: str) -> str:
    """The Airflow UI's page of a DAG run."""
    return f"{dag_path(dag_id)}/runs/{quote(run_id, safe=':+')}"


@dataclass
class PipelineView:
    name: str
    dag_id: str
    last_run: dict[str, Any] | None = None
    tables: list[TableFreshness] = field(default_factory=list)
    error: str | None = None
    dag_state: DagState | None = None  # None for a config file that could not be read

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dag_id": self.dag_id,
            "dag_state": self.dag_state.value if self.dag_state else None,
            "dag_url": dag_path(self.dag_id) if self.dag_id else None,
            "last_run": self.last_run,
            "error": self.error,
            "tables": [t.to_dict() for t in self.tables],
        }


def _dag_states(session: Session, dag_ids: Iterable[str]) -> dict[str, DagState]:
    """Each DAG's state, in one query; a DAG without a row is missing."""
    ids = list(dag_ids)
    rows = session.execute(
        select(DagModel.dag_id, DagModel.is_paused, DagModel.is_stale).where(
            DagModel.dag_id.in_(ids)
        )
    ).all()
    out = dict.fromkeys(ids, DagState.MISSING)
    for dag_id, paused, stale in rows:
        if not stale:
            out[dag_id] = DagState.PAUSED if paused else DagState.ACTIVE
    return out


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None


def _last_runs(session: Session, dag_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The newest run of each DAG (by run_after), in one query."""
    ids = list(dag_ids)
    newest = (
        select(DagRun.dag_id, func.max(DagRun.run_after).label("run_after"))
        .where(DagRun.dag_id.in_(ids))
        .group_by(DagRun.dag_id)
        .subquery()
    )
    runs = session.scalars(
        select(DagRun).join(
            newest,
            (DagRun.dag_id == newest.c.dag_id) & (DagRun.run_after == newest.c.run_after),
        )
    ).all()
    out: dict[str, dict[str, Any]] = {}
    for run in sorted(runs, key=lambda r: r.id):  # two runs at one run_after: the later one
        out[run.dag_id] = {
            "run_id": run.run_id,
            "state": str(run.state) if run.state else None,
            "run_after": _iso(run.run_after),
            "end_date": _iso(run.end_date),
            "url": run_path(run.dag_id, run.run_id),
        }
    return out


def _readable(user: BaseUser, dag_id: str) -> bool:
    return get_auth_manager().is_authorized_dag(
        method="GET", details=DagDetails(id=dag_id), user=user
    )


def collect(user: BaseUser, session: Session, now_ms: int) -> list[PipelineView]:
    """Every pipeline whose DAG the user may read, a failing one carrying its error, then
    each config file that could not be read, with its error.

    403 when there are pipelines but the user may read none of their DAGs.
    """
    found = read_pipelines()
    readable = {
        name: f"cdclake__{name}" for name in found.pipelines if _readable(user, f"cdclake__{name}")
    }
    states = _dag_states(session, readable.values())
    runs = _last_runs(session, readable.values())
    out = []
    for pipeline in found.pipelines.values():
        if pipeline.name not in readable:
            continue
        dag_id = readable[pipeline.name]
        view = PipelineView(pipeline.name, dag_id, runs.get(dag_id), dag_state=states[dag_id])
        try:
            view.tables = pipeline_freshness(pipeline, now_ms)
        except CdclakeError as exc:
            log.warning("freshness of pipeline %s: %s", pipeline.name, exc)
            view.error = str(exc)
        out.append(view)
    if found.pipelines and not out:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "no access to any cdclake pipeline DAG")
    # a broken config has no DAG to check access by; its error says what to fix
    out += [
        PipelineView(name=path.stem, dag_id="", error=str(exc))
        for path, exc in found.errors.items()
    ]
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
h2 .dag, h2 .when, h2 a { font-weight: 400; color: var(--muted); font-size: 13px; }
a { color: var(--run); }
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


_DAG_CLASS = {DagState.ACTIVE: "ok", DagState.PAUSED: "behind", DagState.MISSING: "bad"}
_DAG_TEXT = {
    DagState.ACTIVE: "active",
    DagState.PAUSED: "paused: no scheduled loads",
    DagState.MISSING: "DAG missing: nothing loads this pipeline",
}


def _link(path: str, text: str, title: str | None = None) -> str:
    """A link to an Airflow UI page: relative to this page (mounted at /cdclake/ under the
    UI's root, so it works behind a path prefix), opened in the whole window (`_TOP`)."""
    tip = f' title="{html.escape(title, quote=True)}"' if title else ""
    href = html.escape(".." + path, quote=True)
    return f'<a href="{href}" target="_top" class="ui"{tip}>{text}</a>'


# The UI shows this page in a frame sandboxed without top navigation, so `target="_top"`
# does nothing there; the frame shares the UI's origin, so a link is followed by one the
# UI's own document clicks (opened directly, the page has no frame and the link works)
_TOP = """<script>
document.addEventListener("click", (e) => {
  const a = e.target.closest("a.ui");
  if (!a || window.top === window) return;
  e.preventDefault();
  const doc = window.top.document, link = doc.createElement("a");
  link.href = a.href;
  doc.body.appendChild(link);
  link.click();
});
</script>"""


def _dag_badge(v: PipelineView) -> str:
    state = v.dag_state or DagState.MISSING
    pill = f'<span class="pill {_DAG_CLASS[state]}">{html.escape(_DAG_TEXT[state])}</span>'
    if state is DagState.MISSING:
        return f"<span class='dag'>{html.escape(v.dag_id)}</span> {pill}"
    return f"{_link(dag_path(v.dag_id), html.escape(v.dag_id))} {pill}"


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
    return _link(last_run["url"], badge, last_run["run_id"])


def _batch_cell(batch_id: str | None, text: str) -> str:
    """The batch id, linked to the DAG run that committed it (`<dag id>/<run id>[/...]`)."""
    parts = (batch_id or "").split("/")
    if len(parts) < 2 or not parts[0].startswith("cdclake"):
        return text
    return _link(run_path(parts[0], parts[1]), text)


def _row(t: TableFreshness) -> str:
    cells = freshness_cells(t)
    tds = []
    for name, value in zip(COLUMNS, cells, strict=True):
        css = "num" if name in _NUMERIC else name.replace(" ", "-")
        text = html.escape(value)
        if name == "offsets behind":
            pill = "behind" if t.offsets_behind else "ok"
            text = f'<span class="pill {pill}">{text}</span>'
        elif name == "behind source" and t.seconds_behind_source is not None:
            pill = "behind" if t.seconds_behind_source else "ok"
            text = f'<span class="pill {pill}">{text}</span>'
        elif name == "batch":
            text = _batch_cell(t.batch_id, text)
        tds.append(f'<td class="{css}">{text}</td>')
    return "<tr>" + "".join(tds) + "</tr>"


def _section(v: PipelineView) -> str:
    badges = f"{_dag_badge(v)} {_run_badge(v.last_run)}" if v.dag_id else ""
    head = f"<h2>{html.escape(v.name)} {badges}</h2>"
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
    "when nothing waits, else how long ago the oldest change not loaded yet was committed "
    "in the source (its <code>source.ts_ms</code>; Kafka's record time for a tombstone). "
    "<b>rows</b>: "
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
        f"{body}<p class='legend'>{_LEGEND}</p>{_TOP}</body></html>"
    )
