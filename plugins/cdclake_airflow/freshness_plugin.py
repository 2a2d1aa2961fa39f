"""Airflow plugin: the lake freshness page at /cdclake/freshness, linked in the UI's Browse
menu. The only AirflowPlugin of this project; Airflow imports every file of the plugins
folder, so no other module may import this one (it would register twice)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from cdclake_airflow.freshness_page import URL_PREFIX, app


class CdclakeFreshnessPlugin(AirflowPlugin):
    name = "cdclake_freshness"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "cdclake freshness"}]
    external_views = [
        {
            "name": "Lake freshness",
            "href": f"{URL_PREFIX}/freshness",
            "url_route": "cdclake-freshness",
            "destination": "nav",
            "category": "browse",
        }
    ]
