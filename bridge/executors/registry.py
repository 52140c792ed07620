"""The job registry: which handler runs each job type, under which retry policy and lease.

Handlers are built here, and only here: ``fencebridge run`` (through
:func:`build_registry`), ``fencebridge check`` and ``fencebridge redrive`` all call
:func:`build_job`, so a handler that ``check`` passes is one that ``run`` can start. The
configuration names a handler as ``module.path:attribute``, and the attribute is one of

* a handler instance, used as it is;
* a handler class, called with no arguments;
* a factory: any other callable, called with no arguments, returning a handler instance.

A handler needing settings or secrets reads them where the process runs (its environment,
a mounted file) in its ``__init__`` or its factory, so building it is also the check that they
are there.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Final

from bridge.adapters import sinks
from bridge.errors import ConfigError
from bridge.handlers import (
    RATE_LIMIT_WAIT_MAX_DEFAULT,
    ConditionalWriteHandler,
    Handler,
    IdempotentApiHandler,
    RetryPolicy,
    SameDatabaseHandler,
    UnfencedHandler,
)
from bridge.outbox.limits import LEAST_COMMON, MessageLimits
from bridge.types import TargetClass

if TYPE_CHECKING:
    from bridge.config import BridgeConfig

LEASE_DEFAULT = timedelta(seconds=60)
_BASES = (SameDatabaseHandler, ConditionalWriteHandler, IdempotentApiHandler, UnfencedHandler)
#: the methods each target class's executor calls, with the arguments it passes
_CALLS: Final[dict[TargetClass, tuple[tuple[str, tuple[str, ...]], ...]]] = {
    TargetClass.A: (("handle", ("ctx", "tx")),),
    TargetClass.B: (("handle", ("ctx",)),),
    TargetClass.C: (
        ("validate", ("ctx",)),
        ("perform", ("ctx", "key")),
        ("lookup", ("ctx", "key")),
    ),
    TargetClass.D: (("validate", ("ctx",)), ("call", ("ctx",))),
}


@dataclass(frozen=True, slots=True)
class JobSpec:
    job_type: str
    handler: Handler
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    lease: timedelta = LEASE_DEFAULT
    #: the outbox destinations its handler may publish to, with what each one's broker accepts
    #: of a message (None: any, as in a bare registry, under the narrowest limits)
    outbox_destinations: Mapping[str, MessageLimits] | None = None
    #: the longest wait a RateLimited holds the job type and tenant for; longer ones are cut
    rate_wait_max: timedelta = RATE_LIMIT_WAIT_MAX_DEFAULT

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
        outbox_destinations: Mapping[str, MessageLimits] | frozenset[str] | None = None,
        rate_wait_max: timedelta = RATE_LIMIT_WAIT_MAX_DEFAULT,
    ) -> JobSpec:
        """Register ``handler`` for ``job_type``. ``outbox_destinations`` given as names only
        take the narrowest limits (:data:`bridge.outbox.limits.LEAST_COMMON`)."""
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
        if rate_wait_max <= timedelta(0):
            raise ConfigError(f"job type {job_type!r}: the longest rate limit wait must be > 0")
        destinations = (
            dict.fromkeys(outbox_destinations, LEAST_COMMON)
            if isinstance(outbox_destinations, frozenset)
            else outbox_destinations
        )
        spec = JobSpec(job_type, handler, policy, lease, destinations, rate_wait_max)
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


def load_handler(path: str, *, job_type: str) -> Handler:
    """Import ``module.path:attribute`` and build the handler from it (see the module
    docstring); every failure is a :class:`ConfigError` naming the job type and the cause."""
    where = f"jobs.{job_type}.handler"
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(
            f"{where}: cannot import module {module_name!r} ({type(exc).__name__}: {exc}); "
            "it must be importable by the bridge's Python: installed in its environment or "
            "on PYTHONPATH"
        ) from exc
    try:
        target = getattr(module, attribute)
    except AttributeError as exc:
        raise ConfigError(
            f"{where}: module {module_name!r} has no attribute {attribute!r}"
        ) from exc
    handler = target if isinstance(target, Handler) else _build(target, path, where)
    if not isinstance(handler, _BASES):
        made = "" if handler is target else " built from it"
        raise ConfigError(
            f"{where}: {path!r} is not a fencebridge handler: the object{made} is a "
            f"{type(handler).__name__}; extend one of "
            + ", ".join(b.__name__ for b in _BASES)
            + " (bridge.handlers), or name a factory that returns an instance of one"
        )
    _check_shape(handler, path, where)
    return handler


def _build(target: object, path: str, where: str) -> object:
    if not callable(target):
        return target  # not a handler and not buildable: refused by the caller
    abstract = sorted(getattr(target, "__abstractmethods__", ()))
    if isinstance(target, type) and issubclass(target, _BASES) and abstract:
        raise ConfigError(
            f"{where}: {path!r} leaves {', '.join(abstract)} abstract: implement "
            f"{'it' if len(abstract) == 1 else 'them'} in {target.__name__}"
        )
    kind = "class" if isinstance(target, type) else "factory"
    try:
        return target()
    except Exception as exc:
        raise ConfigError(
            f"{where}: cannot build {path!r}: the {kind} is called with no arguments and "
            f"raised {type(exc).__name__}: {exc}. Give it defaults that read its settings "
            "from the environment, or name a factory (or an instance) that supplies them"
        ) from exc


def _check_shape(handler: Handler, path: str, where: str) -> None:
    """Each method the executor calls must accept the arguments it passes."""
    for method, arguments in _CALLS[handler.target_class]:
        function = getattr(handler, method, None)
        if not callable(function):
            raise ConfigError(f"{where}: {path!r} has no callable {method}")
        try:
            inspect.signature(function).bind(*arguments)
        except TypeError as exc:
            raise ConfigError(
                f"{where}: {type(handler).__name__}.{method} cannot be called as "
                f"{method}({', '.join(arguments)}), as the class {handler.target_class.value} "
                f"executor calls it ({exc})"
            ) from exc
        except ValueError:
            continue  # no signature to read (a builtin): taken at its word


def build_job(
    config: BridgeConfig, job_type: str, registry: Registry, handler: Handler | None = None
) -> JobSpec:
    """Build one job type's handler (unless given) and register it: what ``run`` does for
    each job type at start, and what ``check`` does to see that it can."""
    job = config.jobs[job_type]
    built = handler if handler is not None else load_handler(job.handler, job_type=job_type)
    try:
        return registry.register(
            job_type,
            built,
            retry=RetryPolicy(
                max_attempts=job.max_attempts,
                backoff_initial=timedelta(seconds=job.backoff_initial_seconds),
                backoff_max=timedelta(seconds=job.backoff_max_seconds),
            ),
            lease=timedelta(seconds=job.lease_seconds),
            declared_class=job.target_class,
            outbox_destinations={
                name: sinks.adapter(destination.sink).limits
                for name, destination in config.outbox.items()
            },
            rate_wait_max=timedelta(seconds=job.rate_limit_wait_max_seconds),
        )
    except ConfigError as exc:
        raise ConfigError(f"{config.file}: jobs.{job_type}: {exc}") from exc


def build_registry(config: BridgeConfig, handlers: Mapping[str, Handler] | None = None) -> Registry:
    """Every job type of the configuration; ``handlers`` may supply instances instead."""
    registry = Registry()
    for name in config.jobs:
        build_job(config, name, registry, (handlers or {}).get(name))
    return registry
