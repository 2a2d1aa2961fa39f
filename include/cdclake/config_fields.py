"""The value types of a pipeline file's fields (`cdclake.config`'s dataclasses are made of
them) and their rules, which pydantic checks as it reads a file: each says what is wrong in
words a file's author can act on."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from functools import partial
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, ConfigDict

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_GLOB = re.compile(r"^[A-Za-z0-9_*?]+$")
# at most 100: Airflow DAG ids (cdclake_maintenance__<name>) have at most 250 characters
_PIPELINE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,99}$")
# what Kafka allows in a topic name; the prefix leaves room for ".<schema>.<table>"
_TOPIC_PREFIX = re.compile(r"^(?!\.\.?$)[A-Za-z0-9._-]{1,120}$")
_TRANSFORM = re.compile(
    r"^(?:(?P<column>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<time>years|months|days|hours|year|month|day|hour)"
    r"\((?P<time_column>[A-Za-z_][A-Za-z0-9_]*)\)"
    r"|(?P<sized>bucket|truncate)"
    r"\(\s*(?P<width>\d+)\s*,\s*(?P<sized_column>[A-Za-z_][A-Za-z0-9_]*)\s*\))$"
)
# Airflow's schedule presets (airflow.sdk.definitions.timetables._cron.CRON_PRESETS, @once,
# @continuous); other strings are cron expressions, which Airflow checks with croniter
SCHEDULE_PRESETS: tuple[str, ...] = (
    "@once",
    "@continuous",
    "@hourly",
    "@daily",
    "@weekly",
    "@monthly",
)
SCHEDULE_PRESETS += ("@quarterly", "@yearly")
_CRON_FIELD = re.compile(r"^[0-9A-Za-z*?,/#-]+$")
ORPHAN_MIN_HOURS = 24  # younger files may belong to a commit that is still running

# how a pipeline file is read: an unknown key is refused, a number is taken as text
FILE = ConfigDict(extra="forbid", coerce_numbers_to_str=True)


class FieldProblem(ValueError):
    """A rule broken at `field` (a dotted path: "schema_registry.url") below the object a
    validator checks as a whole, so that the error names that field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field


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


def partition_field(spec: str) -> tuple[str, str]:
    """A `partition_by` entry (`_TRANSFORM`, as the config accepts it) as Iceberg names
    its field's transform and column: "bucket(16, id)" -> ("bucket[16]", "id"),
    "days(ts)" -> ("day", "ts"), "kind" -> ("identity", "kind")."""
    found = _TRANSFORM.match(spec)
    if found is None:
        raise ValueError(f"{spec!r} is not a column or an Iceberg transform")
    if found["column"]:
        return "identity", found["column"]
    if found["time"]:
        return found["time"].removesuffix("s"), found["time_column"]
    return f"{found['sized']}[{found['width']}]", found["sized_column"]


def is_glob(source: str) -> bool:
    return "*" in source or "?" in source


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


def _shaped(pattern: re.Pattern[str], advice: str, value: str) -> str:
    if not pattern.match(_text(value)):
        raise ValueError(f"{value!r} {advice}")
    return value


def _schema_table(globs: bool, value: str) -> str:
    """`value` if it is '<schema>.<table>' (with `globs`, each part may be a pattern)."""
    glob = globs and is_glob(value)
    parts = _text(value).split(".")
    if len(parts) != 2 or not all((_GLOB if glob else IDENTIFIER).match(p) for p in parts):
        how = " (a pattern may use * and ?)" if glob else ""
        raise ValueError(f"{value!r} must be '<schema>.<table>'{how}")
    return value


def _schedule(schedule: str | None) -> str | None:
    """`schedule` if Airflow accepts it as a DAG's schedule (None: manual runs only)."""
    problem = None if schedule is None else schedule_problem(schedule)
    if problem is not None:
        presets = ", ".join(SCHEDULE_PRESETS)
        raise ValueError(
            f"{schedule!r} is not a cron expression ('*/5 * * * *') or one of {presets} or "
            f"null: {problem}"
        )
    return schedule


def _whole(value: Any) -> Any:
    """A count: YAML's true and false are not 1 and 0."""
    if isinstance(value, bool):
        raise ValueError(f"must be a whole number, got {value!r}")
    return value


def _seconds(value: Any) -> float:
    try:
        number = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not 0 < number < math.inf:
        raise ValueError(f"must be a number of seconds > 0, got {value!r}")
    return number


def _orphan_hours(hours: int) -> int:
    if hours < ORPHAN_MIN_HOURS:
        raise ValueError(
            f"must be at least {ORPHAN_MIN_HOURS}, got {hours} (younger unreferenced files may "
            "belong to a load that is still committing)"
        )
    return hours


def _setting(value: Any) -> Any:
    """A value of a free-form map of settings: YAML's booleans as the settings spell them."""
    return ("true" if value else "false") if isinstance(value, bool) else value


def _matching(pattern: re.Pattern[str], advice: str) -> AfterValidator:
    """The rule of a text that must match `pattern`, saying `advice` when it does not."""
    return AfterValidator(partial(_shaped, pattern, advice))


Text = Annotated[str, AfterValidator(_text)]  # required: not empty
OptionalText = Annotated[str | None, AfterValidator(lambda text: text or None)]
Identifier = Annotated[str, _matching(IDENTIFIER, "is not a valid identifier")]
Column = Annotated[str, _matching(IDENTIFIER, "is not a column name")]
_EXAMPLES = "'bucket(16, id)', 'truncate(4, name)', 'days(ts)'"
Transform = Annotated[
    str, _matching(_TRANSFORM, f"is not a column or an Iceberg transform such as {_EXAMPLES}")
]
PipelineName = Annotated[
    str,
    _matching(_PIPELINE_NAME, "must be lower-case letters, digits and underscores (at most 100)"),
]
TopicPrefix = Annotated[
    str,
    _matching(
        _TOPIC_PREFIX,
        "must be 1 to 120 of the characters Kafka allows in a topic name (letters, digits, "
        "'.', '_', '-'), as the connector's topic.prefix",
    ),
]
SourceTable = Annotated[str, AfterValidator(partial(_schema_table, True))]  # or a pattern
SchemaTable = Annotated[str, AfterValidator(partial(_schema_table, False))]
Schedule = Annotated[str | None, AfterValidator(_schedule)]
Whole = Annotated[int, BeforeValidator(_whole)]
Seconds = Annotated[float, BeforeValidator(_seconds)]  # > 0 and finite
OrphanHours = Annotated[int, BeforeValidator(_whole), AfterValidator(_orphan_hours)]
Settings = Mapping[str, Annotated[str, BeforeValidator(_setting)]]  # any key, scalar values
