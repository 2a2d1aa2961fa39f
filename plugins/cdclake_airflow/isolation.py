"""Each pipeline's DAG built on its own, so one broken pipeline file never hides the others.

Airflow marks every DAG of a DAG file as broken (and schedules none of them) when the file
has an import error or one of its DAGs fails validation. So the DAG files hand Airflow only
the DAGs that built and validated; the pipelines that did not are reported by
dags/cdclake_configs.py, a DAG file without DAGs whose import error names each broken file.
DAGs are built with `auto_register=False` so a failed one is not collected after all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from airflow.sdk import DAG
from cdclake.config import PipelineConfig
from cdclake.exceptions import ConfigError
from cdclake_control.pipelines import read_pipelines

Builder = Callable[[PipelineConfig], DAG | None]  # None: this pipeline has no such DAG


@dataclass(frozen=True)
class PipelineDags:
    """The DAGs that built and validated, by id, and an error naming each pipeline file
    that gave none (its config, or the DAG built from it, refused)."""

    dags: dict[str, DAG]
    errors: dict[Path, ConfigError]


def build_isolated(build: Builder, directory: Path | None = None) -> PipelineDags:
    """`build` applied to each pipeline of `directory` on its own, each DAG validated as
    Airflow validates it when it collects a DAG file."""
    found = read_pipelines(directory)
    dags: dict[str, DAG] = {}
    errors = dict(found.errors)
    for pipeline in found.pipelines.values():
        try:
            dag = build(pipeline)
            if dag is not None:
                dag.validate()
        except Exception as exc:  # whatever Airflow refuses in one pipeline's DAG
            errors[pipeline.path] = ConfigError(
                f"{pipeline.path}: its DAG was refused: {type(exc).__name__}: {exc}"
            )
            continue
        if dag is not None:
            dags[dag.dag_id] = dag
    return PipelineDags(dags, errors)


def raise_pipeline_errors(builders: Iterable[Builder], directory: Path | None = None) -> None:
    """One ConfigError naming every broken pipeline file and why, if there is any."""
    messages: dict[str, Path] = {}
    for build in builders:
        for path, error in build_isolated(build, directory).errors.items():
            messages.setdefault(str(error), path)
    if messages:
        raise ConfigError("\n".join(sorted(messages, key=lambda m: (str(messages[m]), m))))
