"""The pipelines of a directory: every pipeline file of it read, one broken file not
taking the others with it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cdclake.config import PipelineConfig
from cdclake.exceptions import ConfigError
from cdclake.pipeline_file import load_pipeline


def pipelines_dir() -> Path:
    """`CDCLAKE_PIPELINES_DIR`, else include/pipelines/ beside this package."""
    env = os.environ.get("CDCLAKE_PIPELINES_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "pipelines"


@dataclass(frozen=True)
class PipelineSet:
    """The pipelines of a directory's YAML files, by name, and the files that could not be
    read, each with the ConfigError naming its file and field. One broken file does not
    take the others with it."""

    pipelines: dict[str, PipelineConfig]
    errors: dict[Path, ConfigError]

    def raise_errors(self) -> None:
        """One ConfigError naming every broken file, if there is any."""
        if self.errors:
            raise ConfigError("\n".join(str(e) for e in self.errors.values()))


def read_pipelines(directory: str | os.PathLike[str] | None = None) -> PipelineSet:
    """Every `*.yaml` of `directory` (default `pipelines_dir()`), in name order. A file
    that does not parse, or whose `name` an earlier file already has, is an error of the
    set; a missing directory is too."""
    directory = Path(directory) if directory is not None else pipelines_dir()
    if not directory.is_dir():
        error = ConfigError(f"{directory}: pipelines directory does not exist")
        return PipelineSet({}, {directory: error})
    pipelines: dict[str, PipelineConfig] = {}
    errors: dict[Path, ConfigError] = {}
    for path in sorted(directory.glob("*.yaml")):
        try:
            pipeline = load_pipeline(path)
        except ConfigError as exc:
            errors[path] = exc
            continue
        if pipeline.name in pipelines:
            errors[path] = ConfigError(
                f"{pipeline.path}: name: {pipeline.name!r} is already used by "
                f"{pipelines[pipeline.name].path}"
            )
            continue
        pipelines[pipeline.name] = pipeline
    return PipelineSet(pipelines, errors)
