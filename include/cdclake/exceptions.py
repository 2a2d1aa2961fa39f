"""All errors cdclake raises on purpose. One base class so callers can catch ours only."""


class CdclakeError(Exception):
    """Base class of every error raised by cdclake."""


class ConfigError(CdclakeError):
    """A pipeline configuration is missing a field or holds a wrong value."""


class EndpointError(CdclakeError):
    """A service (Kafka, catalog, database) could not be reached or answered badly."""


class DecodeError(CdclakeError):
    """A Kafka record is not a Debezium change event cdclake can decode."""


class DataLossError(CdclakeError):
    """Offsets that were never loaded are no longer in Kafka."""


class CommitConflictError(CdclakeError):
    """Another run committed to the same table while this one was working."""


class MaintenanceError(CdclakeError):
    """Table maintenance would have changed what a table says it has consumed."""


def first_line(exc: BaseException) -> str:
    """An error's first line (at most 300 characters) for a message of ours: a library's
    errors (Java's, PostgreSQL's) can run to a stack trace."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
