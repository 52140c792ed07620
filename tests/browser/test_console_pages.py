"""The console's pages in a real browser: logging in, the overview against the database, an
unknown class C row found by its ids, previewed and redriven (the lookup finds it applied),
with its audit entry; a viewer's missing redrive, and the refusals of forms without their CSRF
token. Every page visited is scanned for raw identifiers and payload bytes and screenshotted;
every answer is checked for the security headers.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from playwright.sync_api import Page, expect

from bridge.console.server import PAGE_HEADERS
from tests.browser.conftest import HASHER, OPERATOR, TENANTS, VIEWER, Site

Db = psycopg.Connection[Any]
#: the unknown class C row of the first tenant (see populate)
UNKNOWN = (TENANTS[0], "op-raw-0-2")
REASON = "INC-42: provider status page recovered"


def log_in(page: Page, site: Site, token: str) -> None:
    page.goto(f"{site.url}/login")
    site.snap(page, "login")
    page.fill("#token", token)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{site.url}/")


def open_operation(page: Page, site: Site, tenant: str, op: str) -> None:
    page.goto(f"{site.url}/operation")
    page.fill("#tenant_id", tenant)
    page.fill("#operation_id", op)
    page.get_by_role("button", name="Look up").click()
    expect(page.locator("#operation h2")).to_have_text(f"Operation {HASHER.operation(tenant, op)}")


def csrf_of(page: Page) -> str:
    value = page.locator("input[name=csrf]").first.get_attribute("value")
    assert value
    return value


def audit_count(db: Db) -> int:
    (n,) = db.execute("SELECT count(*) FROM redrive_audit").fetchone()  # type: ignore[misc]
    return int(n)


def state_of(db: Db, tenant: str, op: str) -> str:
    (state,) = db.execute(  # type: ignore[misc]
        "SELECT state FROM work_item WHERE tenant_id = %s AND operation_id = %s", (tenant, op)
    ).fetchone()
    return str(state)


def assert_headers(site: Site) -> None:
    assert site.answers
    for url, headers in site.answers:
        for name, value in PAGE_HEADERS.items():
            assert headers.get(name.lower()) == value, (url, name)
        policy = headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy
        assert "unsafe-inline" not in policy
        # the console's own script only (local times): nothing inline, nothing elsewhere
        assert "script-src 'self';" in policy
        assert "unsafe" not in policy


@pytest.mark.slow
def test_a_wrong_token_is_refused_and_a_right_one_logs_in(page: Page, site: Site) -> None:
    page.goto(f"{site.url}/")
    expect(page).to_have_url(f"{site.url}/login")
    page.fill("#token", OPERATOR + "x")
    with page.expect_response(f"{site.url}/login") as refused:
        page.get_by_role("button", name="Log in").click()
    assert refused.value.status == 401, refused.value.text()
    expect(page.get_by_role("alert")).to_have_text("That token is not valid.")
    site.snap(page, "login-refused")
    assert [c["name"] for c in page.context.cookies()] == ["fencebridge_login"]

    log_in(page, site, OPERATOR)
    expect(page.get_by_test_id("who")).to_have_text("olga (operator)")
    (cookie,) = [c for c in page.context.cookies() if c["name"] == "fencebridge_session"]
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (True, "Strict", "/")
    assert OPERATOR not in cookie["value"]
    assert_headers(site)


@pytest.mark.slow
def test_the_overview_counts_match_the_database(page: Page, site: Site, db: Db) -> None:
    log_in(page, site, VIEWER)
    site.snap(page, "overview")

    cells = page.locator("#counts td[data-state]")
    shown: dict[tuple[str, str, str], int] = {}
    for i in range(cells.count()):
        cell = cells.nth(i)
        n = int(cell.inner_text())
        if n:
            key = (
                cell.get_attribute("data-subscription") or "",
                cell.get_attribute("data-job-type") or "",
                cell.get_attribute("data-state") or "",
            )
            shown[key] = n
    expected = {
        (sub, job, state): n
        for sub, job, state, n in db.execute(
            "SELECT subscription, job_type, state, count(*) FROM work_item GROUP BY 1, 2, 3"
        )
    }
    assert shown == expected
    assert len(expected) > 4
    (total,) = db.execute("SELECT count(*) FROM work_item").fetchone()  # type: ignore[misc]
    totals = page.locator("#counts td[data-total]")
    assert sum(int(totals.nth(i).inner_text()) for i in range(totals.count())) == total
    assert_headers(site)


@pytest.mark.slow
def test_an_unknown_class_c_row_is_found_previewed_and_redriven_with_its_audit(
    page: Page, site: Site, db: Db
) -> None:
    tenant, op = UNKNOWN
    log_in(page, site, OPERATOR)
    page.goto(f"{site.url}/queues/unknown?job_type=mail")
    site.snap(page, "unknown-rows")
    hashes = page.locator("#rows tr.row")
    listed = {hashes.nth(i).get_attribute("data-operation") for i in range(hashes.count())}
    unknown_mail = {
        HASHER.operation(t, o)
        for t, o in db.execute(
            "SELECT tenant_id, operation_id FROM work_item"
            " WHERE state = 'unknown' AND job_type = 'mail'"
        )
    }
    assert listed == unknown_mail
    assert HASHER.operation(tenant, op) in listed

    open_operation(page, site, tenant, op)
    expect(page.get_by_test_id("state")).to_have_text("unknown")
    expect(page.get_by_test_id("class")).to_have_text("C")
    expect(page.locator("#attempts li.attempt")).to_have_count(1)
    site.snap(page, "operation-unknown")

    before = db.execute("SELECT * FROM work_item ORDER BY seq").fetchall()
    page.fill("#reason", REASON)
    page.get_by_role("button", name="Preview redrive").click()
    expect(page.get_by_test_id("summary")).to_contain_text("would move 1, would leave 0")
    expect(page.locator("#report td.to")).to_have_text(["succeeded"])
    expect(page.locator("#report td.note")).to_have_text(["lookup: applied"])
    site.snap(page, "redrive-preview")
    assert db.execute("SELECT * FROM work_item ORDER BY seq").fetchall() == before
    assert audit_count(db) == 0

    page.get_by_role("button", name="Redrive for real").click()
    expect(page.get_by_test_id("summary")).to_have_text("moved 1, left 0")
    expect(page.locator("#audit li.audit")).to_have_count(1)
    expect(page.locator("#audit li.audit")).to_contain_text(
        f"olga moved it unknown → succeeded, reason “{REASON}”"
    )
    site.snap(page, "redrive-done")
    assert state_of(db, tenant, op) == "succeeded"
    assert db.execute(
        "SELECT tenant_id, operation_id, actor, reason, from_state, to_state FROM redrive_audit"
    ).fetchall() == [(tenant, op, "olga", REASON, "unknown", "succeeded")]

    open_operation(page, site, tenant, op)
    expect(page.get_by_test_id("state")).to_have_text("succeeded")
    expect(page.locator("#redrives li.audit")).to_contain_text("olga")
    expect(page.get_by_role("button", name="Preview redrive")).to_have_count(0)
    site.snap(page, "operation-succeeded")
    assert_headers(site)


@pytest.mark.slow
def test_a_viewer_sees_no_redrive_and_a_direct_post_is_forbidden(
    page: Page, site: Site, db: Db
) -> None:
    tenant, op = UNKNOWN
    log_in(page, site, VIEWER)
    open_operation(page, site, tenant, op)
    expect(page.get_by_test_id("state")).to_have_text("unknown")
    expect(page.get_by_role("button", name="Preview redrive")).to_have_count(0)
    expect(page.locator("#reason")).to_have_count(0)
    site.snap(page, "operation-viewer")
    page.goto(f"{site.url}/queues/unknown")
    expect(page.locator("#rows tr.row")).to_have_count(2)
    expect(page.get_by_role("button", name="Preview redrive")).to_have_count(0)
    site.snap(page, "unknown-rows-viewer")

    form = {"csrf": csrf_of(page), "step": "confirm", "state": "unknown", "reason": "sneak"}
    answer = page.request.post(f"{site.url}/redrive", form=form)
    assert answer.status == 403
    assert "the viewer role cannot do this" in answer.text()
    assert audit_count(db) == 0
    assert state_of(db, tenant, op) == "unknown"


@pytest.mark.slow
@pytest.mark.parametrize("csrf", [None, "not-the-token"])
def test_a_post_without_the_csrf_token_is_refused(
    page: Page, site: Site, db: Db, csrf: str | None
) -> None:
    tenant, op = UNKNOWN
    log_in(page, site, OPERATOR)
    token = {} if csrf is None else {"csrf": csrf}
    queue = {"step": "confirm", "state": "unknown", "reason": "forged"}
    for path, form in [
        ("/redrive", queue),
        ("/operation", {"tenant_id": tenant, "operation_id": op}),
        ("/logout", {}),
    ]:
        answer = page.request.post(f"{site.url}{path}", form={**form, **token})
        assert answer.status == 403, path
        assert "CSRF token is missing or wrong" in answer.text()
    assert audit_count(db) == 0
    assert state_of(db, tenant, op) == "unknown"

    # the session outlived the refused logout, and the right token from another origin fails
    page.goto(f"{site.url}/")
    expect(page.get_by_test_id("who")).to_have_text("olga (operator)")
    answer = page.request.post(
        f"{site.url}/redrive",
        form={**queue, "csrf": csrf_of(page)},
        headers={"Origin": "http://elsewhere.example"},
    )
    assert answer.status == 403
    assert audit_count(db) == 0


@pytest.mark.slow
def test_logging_out_ends_the_session(page: Page, site: Site) -> None:
    log_in(page, site, OPERATOR)
    csrf = csrf_of(page)
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(f"{site.url}/login")

    page.goto(f"{site.url}/queues/unknown")
    expect(page).to_have_url(f"{site.url}/login")
    answer = page.request.post(
        f"{site.url}/operation", form={"csrf": csrf, "tenant_id": "t", "operation_id": "o"}
    )
    assert answer.status == 401


@pytest.mark.slow
def test_no_page_shows_a_raw_identifier_or_payload_byte(page: Page, site: Site) -> None:
    """A tour of every page: every tenant's every operation looked up, both queues, rejected
    deliveries, a queue redrive previewed and run; each page's HTML is scanned by ``snap``."""
    log_in(page, site, OPERATOR)
    site.snap(page, "overview")
    for path in ("/queues/unknown", "/queues/quarantined", "/rejected", "/rejected?kind=conflict"):
        page.goto(f"{site.url}{path}")
        site.snap(page, path.strip("/").replace("/", "-").replace("?", "-"))
    expect(page.locator("#rejected tr.rejected")).to_have_count(1)
    for t, tenant in enumerate(TENANTS):
        for op in site.ops:
            if op.startswith(f"op-raw-{t}-"):
                open_operation(page, site, tenant, op)
                site.snap(page, f"operation-{op}")
    page.goto(f"{site.url}/queues/quarantined")
    page.fill("#reason", "handler fixed")
    page.get_by_role("button", name="Preview redrive").click()
    expect(page.get_by_test_id("summary")).to_contain_text("would move")
    site.snap(page, "quarantined-preview")
    page.get_by_role("button", name="Redrive for real").click()
    expect(page.get_by_test_id("summary")).to_contain_text("moved")
    site.snap(page, "quarantined-done")
    page.goto(f"{site.url}/nowhere")
    expect(page.get_by_test_id("status")).to_contain_text("404")
    site.snap(page, "not-found")
    assert site.count >= 2 * len(TENANTS) + 9
    assert_headers(site)
