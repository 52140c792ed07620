"""Browser sessions of the console's pages: a random id in a cookie, everything else here.

The cookie carries only the session id; the principal, the session's CSRF token and the redrive
selections it looked up stay in this process's memory, so a stolen page never holds a token
and a restart logs everybody out (which is the safe direction). A session ends at a fixed
lifetime after login, not after the last request: a forgotten browser cannot keep one alive.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bridge.console.auth import Principal

#: a session lives this long after login, however busy it is
SESSION_SECONDS = 8 * 3600
#: the oldest sessions are dropped past this many, so logins cannot fill the memory
SESSIONS_MAX = 1000
#: redrive selections a session remembers; the oldest go first
SELECTIONS_MAX = 50


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
    """The live sessions; safe to use from the server's request threads."""

    def __init__(
        self,
        lifetime: float = SESSION_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lifetime = lifetime
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    @property
    def lifetime(self) -> float:
        return self._lifetime

    def create(self, principal: Principal) -> Session:
        session = Session(
            id=secrets.token_urlsafe(32),
            principal=principal,
            csrf=secrets.token_urlsafe(32),
            expires_at=self._clock() + self._lifetime,
        )
        with self._lock:
            self._sessions[session.id] = session
            while len(self._sessions) > SESSIONS_MAX:
                self._sessions.popitem(last=False)
        return session

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
