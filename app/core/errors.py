"""The service's own error hierarchy; third-party errors are mapped into it at client edges."""

from __future__ import annotations

from enum import StrEnum


class RecsysError(Exception):
    """Base of every error the service raises on purpose."""


class ConfigError(RecsysError):
    """A configuration or artifact file is missing or malformed; the service must not start."""


class SchemaError(ConfigError):
    """The feature schema file is invalid or disagrees with the model or the stored data."""


class FailureKind(StrEnum):
    """Why a stage fell back; a fixed set, used as a metric label."""

    TIMEOUT = "timeout"
    UNAVAILABLE = "unavailable"
    OVERLOADED = "overloaded"
    CIRCUIT_OPEN = "circuit_open"
    ERROR = "error"
    BAD_DATA = "bad_data"
    MISSING = "missing"


# What says the dependency itself is in trouble, and so counts against its circuit breaker.
# Bad data and overload are answers: the dependency is up.
BREAKING_KINDS = frozenset({FailureKind.TIMEOUT, FailureKind.UNAVAILABLE})


class UnreachableError(RecsysError):
    """A dependency did not answer within the start-up timeout; the service does not start."""


class DependencyError(RecsysError):
    """A call to Redis, Triton or the index failed; stages turn this into a degraded answer."""

    dependency = "dependency"

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(f"{self.dependency} {kind.value}: {message}")
        self.kind = kind


class FeatureStoreError(DependencyError):
    dependency = "redis"


class RankingModelError(DependencyError):
    dependency = "triton"


class CatalogChangeRefusedError(RecsysError):
    """The catalog's change log refused a change (it is full, or an id is unknown)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class UnappliableBatchError(RecsysError):
    """A batch of the catalog's change log that this process cannot apply: it is skipped
    (counted and logged with its number), never retried, and never stops the ones after."""


class RecallError(DependencyError):
    dependency = "index"
