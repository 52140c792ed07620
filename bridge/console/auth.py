"""Bearer tokens and roles: nobody reaches the console anonymously.

Tokens come from ``FENCEBRIDGE_CONSOLE_TOKENS`` (``name:role:token`` entries separated by commas)
or, to keep them out of the process environment, from the file ``FENCEBRIDGE_CONSOLE_TOKENS_FILE``
names (one entry a line; a line starting with ``#`` is a comment, and a ``#`` anywhere else is
part of its token). The name is the actor every audited action
records. A presented token is compared with every configured token in constant time, so the
answer's timing says nothing about how close a guess was.

Behind an authenticating reverse proxy (oauth2-proxy, Google IAP) the console can also take
the user from a header the proxy sets (:class:`ProxyAuth`). That is off unless configured, and
the header is believed only from a peer the configuration trusts: anybody who can reach the
console directly could otherwise type any name into it.
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bridge.errors import ConfigError

TOKENS_ENV = "FENCEBRIDGE_CONSOLE_TOKENS"
TOKENS_FILE_ENV = "FENCEBRIDGE_CONSOLE_TOKENS_FILE"
#: shorter tokens are refused: a console token must not be guessable
MIN_TOKEN_LENGTH = 24


PROXY_HEADER_ENV = "FENCEBRIDGE_CONSOLE_PROXY_HEADER"
PROXY_ROLES_ENV = "FENCEBRIDGE_CONSOLE_PROXY_ROLES"
TRUSTED_PROXIES_ENV = "FENCEBRIDGE_CONSOLE_TRUSTED_PROXIES"
#: Google IAP prefixes the user's address with the identity provider's name
IAP_PREFIX = "accounts.google.com:"
#: addresses the console counts as its own machine
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class Role(enum.Enum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    #: a viewer who may also read one operation's payload bytes, each view audited
    PAYLOAD = "payload"

    def allows(self, needed: Role) -> bool:
        """Every role may do what a viewer may; only an operator redrives, and only the payload
        role reads payload bytes. The two are kept apart on purpose: moving work and reading
        customer data are different trusts, and one token never holds both."""
        return self is needed or needed is Role.VIEWER


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
            entry = raw.strip()
            if not entry or (separator == "\n" and entry.startswith("#")):
                continue
            parts = entry.split(":", 2)
            if len(parts) != 3 or not all(parts):
                raise ConfigError(f"console token entry {number}: expected name:role:token")
            name, role, token = parts
            try:
                parsed = Role(role)
            except ValueError:
                raise ConfigError(
                    f"console token {name!r}: role must be viewer, operator or payload, "
                    f"not {role!r}"
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


class ProxyError(Exception):
    """A request whose proxy header cannot be believed: its status and the reason."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class ProxyAuth:
    """The user a trusted reverse proxy names in ``header``, mapped to a role by ``roles``.

    ``trusted`` lists the proxies' addresses, always explicitly: loopback is not trusted by
    default, since any process of any user on this machine connects from there.
    """

    header: str
    #: user (case-folded) -> role
    roles: Mapping[str, Role]
    trusted: tuple[Network, ...]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None, *, host: str) -> ProxyAuth | None:
        """The configured proxy authentication, or None when ``$PROXY_HEADER_ENV`` is unset."""
        env = os.environ if environ is None else environ
        header = env.get(PROXY_HEADER_ENV, "").strip()
        if not header:
            return None
        if not header.replace("-", "").isalnum():
            raise ConfigError(f"${PROXY_HEADER_ENV}: {header!r} is not an HTTP header name")
        roles: dict[str, Role] = {}
        for number, raw in enumerate(env.get(PROXY_ROLES_ENV, "").split(","), start=1):
            entry = raw.strip()
            if not entry:
                continue
            user, _, role = entry.rpartition(":")
            try:
                parsed = Role(role)
            except ValueError:
                raise ConfigError(
                    f"${PROXY_ROLES_ENV} entry {number}: expected user:role with role viewer, "
                    f"operator or payload"
                ) from None
            if not user.strip():
                raise ConfigError(f"${PROXY_ROLES_ENV} entry {number}: the user is empty")
            roles[user.strip().casefold()] = parsed
        if not roles:
            raise ConfigError(
                f"${PROXY_HEADER_ENV} is set but ${PROXY_ROLES_ENV} maps nobody to a role"
            )
        trusted: list[Network] = []
        for raw in env.get(TRUSTED_PROXIES_ENV, "").split(","):
            if raw.strip():
                try:
                    trusted.append(ipaddress.ip_network(raw.strip(), strict=False))
                except ValueError:
                    raise ConfigError(
                        f"${TRUSTED_PROXIES_ENV}: {raw.strip()!r} is not an address or network"
                    ) from None
        if not trusted:
            raise ConfigError(
                f"${PROXY_HEADER_ENV} on a console bound to {host}: set ${TRUSTED_PROXIES_ENV} "
                "to the proxies' addresses (127.0.0.1 for a proxy on this machine, knowing that "
                "every local process then connects from a trusted address)"
            )
        return cls(header, roles, tuple(trusted))

    def trusts(self, peer: str) -> bool:
        """Whether a connection from ``peer`` may name its user in the header."""
        try:
            address = ipaddress.ip_address(peer.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self.trusted)

    def principal(self, values: Sequence[str] | str | None, peer: str) -> Principal | None:
        """The user the header names, or None when the request carries no such header.

        A header from a peer that is not trusted, or naming a user without a role, is refused
        (:class:`ProxyError`) rather than ignored: it is either a misrouted request or a
        forgery, and neither should fall through to another way in.
        """
        if values is None or not values:
            return None
        if not self.trusts(peer):
            raise ProxyError(401, f"the {self.header} header is not accepted from this address")
        if not isinstance(values, str):
            if len(values) != 1:
                raise ProxyError(401, f"the {self.header} header is repeated: one user only")
            values = values[0]
        value = values
        user = value.strip().removeprefix(IAP_PREFIX)
        role = self.roles.get(user.casefold())
        if not user or role is None:
            raise ProxyError(403, "the proxy's user has no role in this console")
        return Principal(user, role)
