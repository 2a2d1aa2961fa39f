"""Reading a pipeline YAML strictly: no duplicate keys, no key the parser does not ask for,
schedules Airflow accepts. Every error reads `<file>: <field>: <problem>`.

The known keys of a mapping are the keys the parse code asks `Reader.get` for, so a key a
parse function starts reading is known at once, without a second list to keep in step.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import yaml

from cdclake.exceptions import ConfigError

E = TypeVar("E", bound=Enum)

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_MERGE_TAG = "tag:yaml.org,2002:merge"


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


def load_yaml(path: Path) -> Any:
    """The document of `path`, read with StrictLoader; errors name the file."""
    try:
        return yaml.load(path.read_text(), Loader=StrictLoader)  # noqa: S506 (a SafeLoader)
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: file not found") from exc
    except DuplicateKeyError as exc:
        raise ConfigError(f"{path}: {exc.problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc


class Reader:
    """Walks the raw YAML mapping and reports errors as `<file>: <field>: <problem>`.

    Each mapping handed out by `mapping` (and each one given to `strict`) remembers the keys
    the parse code asked for; `refuse_unknown` then refuses any other key it holds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._asked: dict[int, tuple[str, Mapping[str, Any], set[str]]] = {}

    def fail(self, where: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.path}: {where}: {problem}")

    def strict(self, where: str, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """`data` (found at `where`), whose keys must all be asked for."""
        self._asked.setdefault(id(data), (where, data, set()))
        return data

    def refuse_unknown(self) -> None:
        """Refuse the first key of a strict mapping that the parse code never asked for."""
        for where, data, asked in self._asked.values():
            for key in data:
                if str(key) not in asked:
                    here = f"{where}.{key}" if where else str(key)
                    raise self.fail(here, f"unknown key (known: {', '.join(sorted(asked))})")

    def interpolate(self, where: str, value: Any) -> Any:
        if not isinstance(value, str):
            return value

        def replace(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise self.fail(where, f"environment variable {name} is not set and has no default")

        return _ENV_REF.sub(replace, value)

    def get(self, data: Mapping[str, Any], where: str, key: str, kind: type, default: Any = ...):
        here = f"{where}.{key}" if where else key
        asked = self._asked.get(id(data))
        if asked is not None:
            asked[2].add(key)
        if key not in data or data[key] is None:
            if default is ...:
                raise self._missing(data, where, key)
            return default
        value = self.interpolate(here, data[key])
        if default is ... and isinstance(value, str) and not value.strip():
            raise self.fail(here, "must not be empty")
        if kind is int and isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(here, f"must be a {kind.__name__}, got {type(value).__name__}")
        return value

    def one_of(self, data: Mapping[str, Any], where: str, key: str, choices: Sequence[str],
               default: Any = ...) -> Any:  # fmt: skip
        """The key's string, which must be one of `choices` (`default` without it)."""
        value = self.get(data, where, key, str, default)
        if value is not None and value not in choices:
            here = f"{where}.{key}" if where else key
            raise self.fail(here, f"{value!r} is not one of {list(choices)}")
        return value

    def choice(self, data: Mapping[str, Any], where: str, key: str, kind: type[E],
               default: Any = ...) -> E:  # fmt: skip
        """The member of the Enum `kind` whose value the key holds (`default` without it;
        required when no default is given)."""
        fallback = default if default is ... else default.value
        return kind(self.one_of(data, where, key, [e.value for e in kind], fallback))

    def _missing(self, data: Mapping[str, Any], where: str, key: str) -> ConfigError:
        """`key is required`, or, when the mapping holds a key not asked for yet that looks
        like a misspelling of it, that key refused as unknown."""
        asked = self._asked.get(id(data))
        if asked is not None:
            others = [str(k) for k in data if str(k) not in asked[2]]
            close = difflib.get_close_matches(key, others, n=1, cutoff=0.8)
            if close:
                here = f"{where}.{close[0]}" if where else close[0]
                return self.fail(here, f"unknown key (did you mean {key!r}? it is required)")
        return self.fail(f"{where}.{key}" if where else key, "is required")

    def mapping(self, data: Mapping[str, Any], where: str, key: str, required: bool = True):
        """The mapping at `key`, strict: its keys are the ones the parse code asks for."""
        value = self.get(data, where, key, dict, ... if required else {})
        return self.strict(f"{where}.{key}" if where else key, value)

    def string_map(self, data: Mapping[str, Any], where: str, key: str) -> dict[str, str]:
        """A free-form mapping of settings (`properties`, `conf`): any key, scalar values."""
        raw = self.get(data, where, key, dict, {})
        out: dict[str, str] = {}
        for k, v in raw.items():
            here = f"{where}.{key}.{k}" if where else f"{key}.{k}"
            v = self.interpolate(here, v)
            if isinstance(v, bool):
                v = "true" if v else "false"
            if not isinstance(v, (str, int, float)):
                raise self.fail(here, f"must be a scalar, got {type(v).__name__}")
            out[str(k)] = str(v)
        return out


# Airflow's schedule presets (airflow.sdk.definitions.timetables._cron.CRON_PRESETS, @once,
# @continuous); other strings are cron expressions, which Airflow checks with croniter
SCHEDULE_PRESETS = (
    "@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly",
)  # fmt: skip
_CRON_FIELD = re.compile(r"^[0-9A-Za-z*?,/#-]+$")


def schedule_problem(schedule: str) -> str | None:
    """Why Airflow would refuse `schedule` as a DAG's schedule, or None. croniter (which
    Airflow checks cron expressions with) decides when it is installed; else five fields of
    cron characters are required."""
    if schedule in SCHEDULE_PRESETS:
        return None
    try:
        from croniter import CroniterError, croniter
    except ImportError:  # an environment without Airflow: the shape only
        parts = schedule.split()
        if len(parts) == 5 and all(_CRON_FIELD.match(p) for p in parts):
            return None
        return "a cron expression has 5 fields (minute hour day month weekday)"
    try:
        croniter(schedule)
    except (CroniterError, ValueError) as exc:
        return str(exc)
    return None
