"""The job registry: which handler runs each job type, under which retry policy and lease."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from bridge.errors import ConfigError
from bridge.handlers import (
    ConditionalWriteHandler,
    Handler,
    IdempotentApiHandler,
    RetryPolicy,
    SameDatabaseHandler,
    UnfencedHandler,
)
from bridge.types import TargetClass

LEASE_DEFAULT = timedelta(seconds=60)
_BASES = (SameDatabaseHandler, ConditionalWriteHandler, IdempotentApiHandler, UnfencedHandler)


@dataclass(frozen=True, slots=True)
class JobSpec:
    job_type: str
    handler: Handler
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    lease: timedelta = LEASE_DEFAULT

    @property
    def target_class(self) -> TargetClass:
        return self.handler.target_class


class Registry:
    """Job type → :class:`JobSpec`. Registration checks what can be checked before running."""

    def __init__(self) -> None:
        self._specs: dict[str, JobSpec] = {}

    def register(
        self,
        job_type: str,
        handler: Handler,
        *,
        retry: RetryPolicy | None = None,
        lease: timedelta = LEASE_DEFAULT,
        declared_class: TargetClass | None = None,
    ) -> JobSpec:
        if job_type in self._specs:
            raise ConfigError(f"job type {job_type!r} is registered twice")
        if not isinstance(handler, _BASES):
            raise ConfigError(
                f"job type {job_type!r}: the handler must extend one of "
                + ", ".join(b.__name__ for b in _BASES)
                + f" (its target class), not {type(handler).__name__}"
            )
        if declared_class is not None and declared_class != handler.target_class:
            raise ConfigError(
                f"job type {job_type!r}: declared target class {declared_class.value}, but "
                f"{type(handler).__name__} is a class {handler.target_class.value} handler"
            )
        policy = retry or RetryPolicy()
        if policy.max_attempts < 1:
            raise ConfigError(f"job type {job_type!r}: max_attempts must be at least 1")
        if handler.target_class is TargetClass.D and policy.max_attempts != 1:
            raise ConfigError(
                f"job type {job_type!r}: a class D target allows at most one attempt "
                f"(max_attempts = 1), not {policy.max_attempts}"
            )
        if lease <= timedelta(0):
            raise ConfigError(f"job type {job_type!r}: the lease must be positive")
        spec = JobSpec(job_type, handler, policy, lease)
        self._specs[job_type] = spec
        return spec

    def __getitem__(self, job_type: str) -> JobSpec:
        return self._specs[job_type]

    def get(self, job_type: str) -> JobSpec | None:
        return self._specs.get(job_type)

    def __contains__(self, job_type: object) -> bool:
        return job_type in self._specs

    @property
    def job_types(self) -> list[str]:
        return sorted(self._specs)

    def specs(self) -> list[JobSpec]:
        return [self._specs[k] for k in self.job_types]
