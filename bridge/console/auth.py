"""Bearer tokens and roles: nobody reaches the console anonymously.

Tokens come from ``FENCEBRIDGE_CONSOLE_TOKENS`` (``name:role:token`` entries separated by commas)
or, to keep them out of the process environment, from the file ``FENCEBRIDGE_CONSOLE_TOKENS_FILE``
names (one entry a line; ``#`` starts a comment). The name is the actor every audited action
records. A presented token is compared with every configured token in constant time, so the
answer's timing says nothing about how close a guess was.
"""

from __future__ import annotations

import enum
import hmac
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bridge.errors import ConfigError

TOKENS_ENV = "FENCEBRIDGE_CONSOLE_TOKENS"
TOKENS_FILE_ENV = "FENCEBRIDGE_CONSOLE_TOKENS_FILE"
#: shorter tokens are refused: a console token must not be guessable
MIN_TOKEN_LENGTH = 24


class Role(enum.Enum):
    VIEWER = "viewer"
    OPERATOR = "operator"

    def allows(self, needed: Role) -> bool:
        """An operator may do what a viewer may, and redrive."""
        return self is Role.OPERATOR or needed is Role.VIEWER


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request is: the token's name (the audit's actor) and its role."""

    name: str
    role: Role


@dataclass(frozen=True, slots=True)
class _Token:
    principal: Principal
    secret: bytes


class Tokens:
    """The configured tokens; :meth:`authenticate` maps a presented one to its principal."""

    def __init__(self, entries: Sequence[tuple[str, Role, str]]) -> None:
        if not entries:
            raise ConfigError(
                f"the console needs at least one token: set ${TOKENS_ENV} or ${TOKENS_FILE_ENV}"
            )
        names = [name for name, _, _ in entries]
        if len(set(names)) != len(names):
            raise ConfigError("console token names must be unique: each is an audit actor")
        secrets = [token for _, _, token in entries]
        if len(set(secrets)) != len(secrets):
            raise ConfigError("two console tokens are equal: each token names one actor")
        self._tokens = tuple(
            _Token(Principal(name, role), token.encode()) for name, role, token in entries
        )

    @classmethod
    def parse(cls, text: str, *, separator: str = ",") -> Tokens:
        """``name:role:token`` entries, split on ``separator``; blank entries and comments are
        skipped."""
        entries: list[tuple[str, Role, str]] = []
        for number, raw in enumerate(text.split(separator), start=1):
            entry = raw.split("#", 1)[0].strip() if separator == "\n" else raw.strip()
            if not entry:
                continue
            parts = entry.split(":", 2)
            if len(parts) != 3 or not all(parts):
                raise ConfigError(f"console token entry {number}: expected name:role:token")
            name, role, token = parts
            try:
                parsed = Role(role)
            except ValueError:
                raise ConfigError(
                    f"console token {name!r}: role must be viewer or operator, not {role!r}"
                ) from None
            if len(token) < MIN_TOKEN_LENGTH:
                raise ConfigError(
                    f"console token {name!r}: at least {MIN_TOKEN_LENGTH} characters are needed"
                )
            entries.append((name, parsed, token))
        return cls(entries)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Tokens:
        env = os.environ if environ is None else environ
        inline, path = env.get(TOKENS_ENV), env.get(TOKENS_FILE_ENV)
        if inline and path:
            raise ConfigError(f"set ${TOKENS_ENV} or ${TOKENS_FILE_ENV}, not both")
        if path:
            try:
                text = Path(path).read_text("utf-8")
            except OSError as exc:
                raise ConfigError(f"cannot read ${TOKENS_FILE_ENV}: {exc.strerror}") from None
            return cls.parse(text, separator="\n")
        return cls.parse(inline or "")

    def authenticate(self, presented: str) -> Principal | None:
        """The principal of ``presented``, or None; every token is compared, in constant time."""
        given = presented.encode()
        found: Principal | None = None
        for token in self._tokens:
            if hmac.compare_digest(token.secret, given):
                found = token.principal
        return found
