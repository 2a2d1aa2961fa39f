"""Pipeline files read into `PipelineConfig`: the YAML read strictly (a duplicate key is an
error), `${VAR}` and `${VAR:-default}` expanded, then every field checked by pydantic against
the rules of the config classes. Every error reads `<file>: <field>: <problem>`, one line
each, so a broken file shows up in the Airflow UI (as a DAG import error) with enough
information to fix it."""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import fields, is_dataclass
from functools import cache
from pathlib import Path
from typing import Any, get_args, get_type_hints

import yaml
from pydantic import TypeAdapter, ValidationError

from cdclake.config import PipelineConfig
from cdclake.config_fields import FieldProblem
from cdclake.exceptions import ConfigError

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_MERGE_TAG = "tag:yaml.org,2002:merge"
# null gives a field its default, except where null is a value of its own
_NULL_KEPT = frozenset({"maintenance.schedule"})  # manual runs only; absent: "@daily"
# fields the pipeline fills in itself (`PipelineConfig._as_a_whole`), never read from a file
_FILLED = frozenset(
    {"path", "patterns", "kafka.timeouts", "catalog.timeouts", "kafka.schema_registry.timeout_s"}
)
# pydantic's words where they would name Python's types rather than the file's
_PROBLEMS = {
    "missing": "is required",
    "dataclass_type": "must be a mapping",
    "dict_type": "must be a mapping",
    "too_short": "must not be empty",
}
_UNKNOWN = ("unexpected_keyword_argument", "extra_forbidden")


def load_pipeline(path: str | os.PathLike[str]) -> PipelineConfig:
    """Read and validate one pipeline YAML file. Keys are strict: a duplicate key, or one
    that is no field of its section, is an error naming it."""
    path = Path(path).resolve()
    document = _load_yaml(path)
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: must be a YAML mapping at the top level")
    try:
        document = {**_expand(document, ()), "path": path}
        return _validator().validate_python(document, context={"file": path})
    except FieldProblem as exc:
        raise ConfigError(f"{path}: {exc.field}: {exc}") from exc
    except ValidationError as exc:
        raise ConfigError("\n".join(_problems(path, exc))) from exc


@cache
def _validator() -> TypeAdapter[PipelineConfig]:
    return TypeAdapter(PipelineConfig)


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping gives the same key twice (PyYAML would keep the last one silently)."""


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a duplicate key in any mapping, naming its path and lines."""

    def construct_document(self, node: yaml.Node) -> Any:
        _refuse_duplicates(node, "", set())
        return super().construct_document(node)


def _refuse_duplicates(node: yaml.Node, where: str, seen: set[int]) -> None:
    if id(node) in seen:  # an alias of a node already walked (or a recursive one)
        return
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicates(item, f"{where}[{i}]", seen)
    if not isinstance(node, yaml.MappingNode):
        return
    first: dict[str, int] = {}
    for key_node, value_node in node.value:
        if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
            _refuse_duplicates(value_node, where, seen)
            continue
        here = f"{where}.{key_node.value}" if where else str(key_node.value)
        line = key_node.start_mark.line + 1
        if key_node.value in first:
            lines = f"lines {first[key_node.value]} and {line}"
            raise DuplicateKeyError(problem=f"{here}: duplicate key ({lines})")
        first[key_node.value] = line
        _refuse_duplicates(value_node, here, seen)


def _load_yaml(path: Path) -> Any:
    """The document of `path`, read with StrictLoader; errors name the file."""
    try:
        return yaml.load(path.read_text(), Loader=StrictLoader)  # noqa: S506 (a SafeLoader)
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: file not found") from exc
    except DuplicateKeyError as exc:
        raise ConfigError(f"{path}: {exc.problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc


def _expand(value: Any, loc: tuple[str | int, ...]) -> Any:
    """`value` (found at `loc`) with the environment variables its strings name expanded
    and its mappings' null entries left out; a field the pipeline fills in is refused."""
    if isinstance(value, list):
        return [_expand(item, (*loc, i)) for i, item in enumerate(value)]
    if isinstance(value, dict):
        kept = {}
        for key, item in value.items():
            here = _field((*loc, key))
            if here in _FILLED:
                raise FieldProblem(here, _unknown((*loc, key), set()))
            if item is not None or here in _NULL_KEPT:
                kept[key] = _expand(item, (*loc, key))
        return kept
    if not isinstance(value, str):
        return value

    def variable(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        problem = f"environment variable {name} is not set and has no default"
        raise FieldProblem(_field(loc), problem)

    return _ENV_REF.sub(variable, value)


def _problems(path: Path, exc: ValidationError) -> list[str]:
    """One line per error pydantic found: `<file>: <field>: <problem>`."""
    errors = exc.errors(include_url=False)
    missing = {error["loc"] for error in errors if error["type"] == "missing"}
    lines = []
    for error in errors:
        loc, cause = error["loc"], error.get("ctx", {}).get("error")
        if isinstance(cause, FieldProblem):
            loc = (*loc, cause.field)
        if isinstance(cause, ValueError):
            problem = str(cause)
        elif error["type"] in _UNKNOWN:
            problem = _unknown(loc, missing)
        else:
            problem = _PROBLEMS.get(error["type"], error["msg"])
        lines.append(f"{path}: {_field(loc)}: {problem}")
    return lines


def _field(loc: tuple[Any, ...]) -> str:
    """A field's path as a file's author reads it: `tables[2].delete_mode`."""
    text = str(loc[0]) if loc else ""
    for part in loc[1:]:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def _unknown(loc: tuple[Any, ...], missing: set[tuple[Any, ...]]) -> str:
    """The problem of a key its section does not know: the required key it looks like a
    misspelling of, or the keys the section knows."""
    *section, key = loc
    required = [str(m[-1]) for m in missing if list(m[:-1]) == section]
    close = difflib.get_close_matches(str(key), required, n=1, cutoff=0.8)
    if close:
        return f"unknown key (did you mean {close[0]!r}? it is required)"
    kind: Any = PipelineConfig
    for part in section:  # the config class of the section, from the fields' types
        if isinstance(part, str):
            kind = get_type_hints(kind)[part]
        kind = next(k for k in (kind, *get_args(kind)) if isinstance(k, type) and is_dataclass(k))
    known = [f.name for f in fields(kind) if _field((*section, f.name)) not in _FILLED]
    return f"unknown key (known: {', '.join(sorted(known))})"
