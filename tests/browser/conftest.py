"""Browser fixtures: Debian's chromium driven by Playwright, and a console over a populated
database.

Playwright's own browser download is never used: the tests launch the system's ``chromium``.
Without one they are skipped with the reason, except in CI (``CI=true``), which must run them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import Browser, Page, Response, sync_playwright

from bridge import keyring
from bridge.console.auth import Tokens
from bridge.console.server import ConsoleServer
from bridge.store import PostgresStore
from tests.integration.test_console_api import (
    HASHER,
    OPERATOR,
    PAYLOAD,
    PAYLOAD_MARK,
    TENANTS,
    TOKENS,
    VIEWER,
    console_api,
    populate,
)

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
__all__ = [
    "HASHER",
    "OPERATOR",
    "PAYLOAD",
    "PAYLOAD_MARK",
    "TENANTS",
    "VIEWER",
    "Site",
    "shown_time",
]


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    executable = shutil.which("chromium")
    if executable is None:
        reason = "no chromium on PATH (apt-get install chromium); the console's browser tests"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason} must run in CI")
        pytest.skip(f"{reason} are skipped")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Site:
    """The console under test, and what no page of it may ever show."""

    url: str
    ops: list[str]
    secrets: list[str]
    shots: Path
    #: every answer of the console a page received: (url, headers)
    answers: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    count: int = 0

    def snap(self, page: Page, name: str) -> str:
        """The page's HTML, checked for raw identifiers and payload bytes, and a screenshot."""
        html = page.content()
        leaks = [s for s in self.secrets if s in html]
        assert leaks == [], (name, leaks)
        self.count += 1
        page.screenshot(path=self.shots / f"{self.count:02d}-{name}.png", full_page=True)
        return html

    def watch(self, page: Page) -> Page:
        def record(response: Response) -> None:
            if response.url.startswith(self.url):
                self.answers.append((response.url, response.headers))

        page.on("response", record)
        return page


@pytest.fixture
def site(store: PostgresStore, db_url: str, tmp_path: Path) -> Iterator[Site]:
    keyring.attach(store.keys, HASHER, used_by="test")
    ops = populate(store)
    server = ConsoleServer(console_api(store, db_url), Tokens.parse(TOKENS), "127.0.0.1", 0)
    server.start()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    try:
        yield Site(f"http://127.0.0.1:{server.port}", ops, [*TENANTS, *ops, PAYLOAD_MARK], shots)
    finally:
        server.stop()


#: the zone the tests' browser lives in: the pages show times in it, to the second
VIEWER_ZONE = "Europe/Berlin"


def shown_time(at: datetime) -> str:
    """``at`` as a page shows it to a viewer in :data:`VIEWER_ZONE`."""
    local = at.astimezone(ZoneInfo(VIEWER_ZONE))
    offset = local.strftime("%z")
    return f"{local:%Y-%m-%d %H:%M:%S} UTC{offset[:3]}:{offset[3:]}"


@pytest.fixture
def page(browser: Browser, site: Site) -> Iterator[Page]:
    context = browser.new_context(timezone_id=VIEWER_ZONE)
    try:
        yield site.watch(context.new_page())
    finally:
        context.close()
