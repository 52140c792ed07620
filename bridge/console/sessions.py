"""Browser sessions of the console's pages: a signed random id in a cookie, everything else here.

The cookie carries only the session id, signed with itsdangerous under this process's key (a
cookie the console did not issue is no session, whatever it holds); the principal, the
session's CSRF token and the redrive selections it looked up stay in this process's memory, so
a stolen page never holds a token and a restart logs everybody out (the safe direction). A
session ends at a fixed lifetime after login, not after the last request: a forgotten browser
cannot keep one alive.

Each user holds at most :data:`SESSIONS_PER_USER` sessions (a new login ends that user's
oldest): one user logging in again and again ends only their own sessions, never another's.
Past :data:`SESSIONS_MAX` sessions in all, a login is refused rather than anybody logged out.

The login form's nonces are issued here too, and each is taken once: a form posted twice, or a
nonce copied from an old page, is refused.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from itsdangerous import BadSignature, URLSafeSerializer

from bridge.console.auth import Principal

#: a session lives this long after login, however busy it is
SESSION_SECONDS = 8 * 3600
#: sessions one user may hold at once; a new login ends the user's oldest
SESSIONS_PER_USER = 5
#: sessions in all; past this a login is refused (nobody else is logged out)
SESSIONS_MAX = 1000
#: redrive selections a session remembers; the oldest go first
SELECTIONS_MAX = 50
#: a login form's nonce is good this long, once
NONCE_SECONDS = 600
#: unused nonces kept; the oldest are forgotten first (their forms must be loaded again)
NONCES_MAX = 10_000
#: what a value the console issued looks like: url-safe base64 and itsdangerous's separator
TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_\-.]{16,200}")


class SessionsFullError(Exception):
    """No session can be opened: :data:`SESSIONS_MAX` are live."""


class Signer:
    """Signs and checks the values the console hands to a browser (session cookies, cursors,
    handles), each under its own purpose, so a value made for one use is refused in another."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret is not None else secrets.token_bytes(32)

    def sign(self, purpose: str, value: Any) -> str:
        return str(URLSafeSerializer(self._secret, salt=purpose).dumps(value))

    def unsign(self, purpose: str, token: str | None) -> Any:
        """The value ``token`` carries, or None when the console did not sign it for
        ``purpose``."""
        if not token or TOKEN_SHAPE.fullmatch(token) is None:
            return None
        try:
            return URLSafeSerializer(self._secret, salt=purpose).loads(token)
        except BadSignature:
            return None


@dataclass(frozen=True, slots=True)
class Selection:
    """A redrive selection a page looked up, kept server-side so the raw identifiers it needs
    never travel through a page: the form carries only its handle."""

    #: the redrive request's selection fields (``tenant_id``, ``operation_id``, ``states``, ...)
    fields: dict[str, Any]
    #: what the page says it selects (hashes and names only)
    label: str
    #: the one form that may use it (``redrive``, ``payload``): a handle the operation page
    #: made for a payload view cannot be replayed as a redrive, nor the other way round
    purpose: str = "redrive"


@dataclass(slots=True)
class Session:
    id: str
    principal: Principal
    csrf: str
    expires_at: float
    selections: OrderedDict[str, Selection] = field(default_factory=OrderedDict)

    def remember(self, selection: Selection) -> str:
        """A fresh handle for ``selection``."""
        handle = secrets.token_urlsafe(16)
        self.selections[handle] = selection
        while len(self.selections) > SELECTIONS_MAX:
            self.selections.popitem(last=False)
        return handle

    def csrf_matches(self, presented: str | None) -> bool:
        return presented is not None and secrets.compare_digest(
            self.csrf.encode(), presented.encode()
        )


class Sessions:
    """The live sessions and login nonces; safe to use from the server's request threads."""

    def __init__(
        self,
        lifetime: float = SESSION_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        *,
        signer: Signer | None = None,
        per_user: int = SESSIONS_PER_USER,
        most: int = SESSIONS_MAX,
    ) -> None:
        self._lifetime = lifetime
        self._clock = clock
        self._signer = signer or Signer()
        self._per_user = per_user
        self._most = most
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._nonces: OrderedDict[str, float] = OrderedDict()

    @property
    def lifetime(self) -> float:
        return self._lifetime

    @property
    def signer(self) -> Signer:
        return self._signer

    def create(self, principal: Principal) -> Session:
        """A new session for ``principal``; the user's oldest goes past the per-user cap.
        Raises :class:`SessionsFullError` when every slot is taken by live sessions."""
        session = Session(
            id=secrets.token_urlsafe(32),
            principal=principal,
            csrf=secrets.token_urlsafe(32),
            expires_at=self._clock() + self._lifetime,
        )
        with self._lock:
            self._expire()
            own = [s.id for s in self._sessions.values() if s.principal.name == principal.name]
            for old in own[: max(len(own) - self._per_user + 1, 0)]:
                del self._sessions[old]
            if len(self._sessions) >= self._most:
                raise SessionsFullError
            self._sessions[session.id] = session
        return session

    def _expire(self) -> None:
        now = self._clock()
        for gone in [s.id for s in self._sessions.values() if now >= s.expires_at]:
            del self._sessions[gone]

    def get(self, session_id: str | None) -> Session | None:
        """The live session with this id; an expired one is forgotten on the way."""
        if not session_id:
            return None
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return None
            if self._clock() >= session.expires_at:
                del self._sessions[session_id]
                return None
            return session

    def drop(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    def of(self, user: str) -> int:
        """How many live sessions ``user`` holds."""
        with self._lock:
            self._expire()
            return sum(1 for s in self._sessions.values() if s.principal.name == user)

    # -- the cookie ----------------------------------------------------------------------------

    def cookie_value(self, session: Session) -> str:
        return self._signer.sign("session", session.id)

    def from_cookie(self, value: str | None) -> Session | None:
        """The live session a cookie value names, or None (unsigned, forged or expired)."""
        session_id = self._signer.unsign("session", value)
        return self.get(session_id) if isinstance(session_id, str) else None

    # -- login nonces --------------------------------------------------------------------------

    def issue_nonce(self) -> str:
        nonce = secrets.token_urlsafe(32)
        with self._lock:
            self._nonces[nonce] = self._clock() + NONCE_SECONDS
            while len(self._nonces) > NONCES_MAX:
                self._nonces.popitem(last=False)
        return nonce

    def take_nonce(self, nonce: str | None) -> bool:
        """Whether ``nonce`` was issued here and is still good; it is good only once."""
        if not nonce:
            return False
        with self._lock:
            expires = self._nonces.pop(nonce, None)
        return expires is not None and self._clock() < expires
