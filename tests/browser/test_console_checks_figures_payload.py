"""The console's go/no-go page, the overview's figures and the audited payload view in a real
browser: the checks page shows the check's own report, the overview's figures agree with the
rows, and a payload holder sees one operation's payload only after giving a reason, with the
view in the audit, while no other page (the operation page included) ever shows its bytes."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import HASHER, PAYLOAD, PAYLOAD_MARK, TENANTS, VIEWER, Site, shown_time
from tests.browser.test_console_pages import assert_headers, log_in, open_operation
from tests.integration.test_console_api import check_of

Db = psycopg.Connection[Any]
#: a succeeded row of the first tenant (see populate)
SUCCEEDED = (TENANTS[0], "op-raw-0-0")
REASON = "DSR-12: the customer asks what was sent"


def test_the_checks_page_shows_the_go_no_go_report(page: Page, site: Site, db_url: str) -> None:
    report = check_of(db_url)()
    log_in(page, site, VIEWER)
    page.get_by_role("link", name="Checks").click()
    expect(page).to_have_url(f"{site.url}/checks")
    site.snap(page, "checks")

    rows = page.locator("#checks tr.finding")
    expect(rows).to_have_count(len(report.findings))
    shown = [
        (
            rows.nth(i).get_attribute("data-job-type"),
            int(rows.nth(i).get_attribute("data-control") or 0),
            rows.nth(i).get_attribute("data-go") == "true",
        )
        for i in range(rows.count())
    ]
    assert shown == [(f.job_type, f.control.number, f.verdict.go) for f in report.findings]
    expect(page.locator("#verdict")).to_have_text(
        "NO-GO: 4 control(s) fail (charge: 7, 9; mail: 7, 9)"
    )
    assert_headers(site)


def test_the_overview_shows_the_figures_of_the_rows(page: Page, site: Site, db: Db) -> None:
    # the claimed rows' leases ran out a minute ago; a takeover five minutes ago
    db.execute(
        "UPDATE work_item SET lease_expires_at = now() - interval '1 minute'"
        " WHERE state = 'claimed'"
    )
    (tenant, op) = db.execute(  # type: ignore[misc]
        "SELECT tenant_id, operation_id FROM work_item WHERE state = 'claimed' LIMIT 1"
    ).fetchone()
    # a takeover records the attempt it took over, ended at that moment as lease_lost
    db.execute(
        "INSERT INTO work_attempt (tenant_id, operation_id, kind, fence, started_at, ended_at,"
        " outcome, outcome_code) VALUES (%s, %s, 'claim', 9, now() - interval '7 minutes',"
        " now() - interval '5 minutes', 'lease_lost', 'lease_expired')",
        (tenant, op),
    )
    log_in(page, site, VIEWER)
    site.snap(page, "overview-figures")

    expect(page.locator("#current [data-figure=stalled]")).to_have_text("2")
    expect(page.locator("#current [data-figure=oldest_unknown_seconds]")).to_contain_text(" s")
    points = page.locator("#series tr.point")
    expect(points).to_have_count(60)
    # the series table is folded away: read the cells' text, shown or not
    quarantined = page.locator("#series tr.point td:nth-child(4)").all_text_contents()
    takeovers = page.locator("#series tr.point td:nth-child(5)").all_text_contents()
    # two rows quarantined by their handler and one undecodable delivery; one takeover
    assert (sum(map(int, quarantined)), sum(map(int, takeovers))) == (3, 1)
    charts = page.locator("svg[data-chart] polyline")
    expect(charts).to_have_count(4)
    for i in range(4):
        assert len((charts.nth(i).get_attribute("points") or "").split()) == 60
    page.select_option("#window", "6h")
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#series tr.point")).to_have_count(72)
    assert_headers(site)


def payload_views(db: Db) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT tenant_id, operation_id, actor, reason FROM redrive_audit"
        " WHERE to_state = 'payload_viewed' ORDER BY id"
    ).fetchall()


@pytest.mark.slow
def test_a_payload_view_needs_the_role_and_a_reason_and_is_audited(
    page: Page, site: Site, db: Db
) -> None:
    tenant, op = SUCCEEDED
    log_in(page, site, VIEWER)
    open_operation(page, site, tenant, op)
    expect(page.locator("form#payload")).to_have_count(0)
    page.get_by_role("button", name="Log out").click()

    log_in(page, site, PAYLOAD)
    open_operation(page, site, tenant, op)
    site.snap(page, "operation-before-payload-view")
    assert payload_views(db) == []
    page.fill("#payload_reason", REASON)
    page.get_by_role("button", name="View payload").click()

    expect(page.locator("#payload-bytes")).to_contain_text(PAYLOAD_MARK)
    expect(page.locator("#recorded")).to_contain_text(f"as pia, reason “{REASON}”")
    assert payload_views(db) == [(tenant, op, "pia", REASON)]
    # the operation page lists the view, and shows no bytes
    open_operation(page, site, tenant, op)
    site.snap(page, "operation-after-payload-view")
    expect(page.locator("#payload-views li.audit")).to_have_text(
        [f"{_viewed_at(db)}: pia viewed the payload, reason “{REASON}”"]
    )
    expect(page.locator("#operation h2")).to_have_text(f"Operation {HASHER.operation(tenant, op)}")
    assert_headers(site)


def _viewed_at(db: Db) -> str:
    (at,) = db.execute(  # type: ignore[misc]
        "SELECT at FROM redrive_audit WHERE to_state = 'payload_viewed'"
    ).fetchone()
    return shown_time(at)


@pytest.mark.slow
def test_no_page_but_the_audited_view_shows_payload_bytes(page: Page, site: Site) -> None:
    """A payload holder's tour of every page after one view: each page's HTML is scanned by
    ``snap`` for payload bytes and raw identifiers."""
    log_in(page, site, PAYLOAD)
    open_operation(page, site, *SUCCEEDED)
    page.fill("#payload_reason", REASON)
    page.get_by_role("button", name="View payload").click()
    expect(page.locator("#payload-bytes")).to_contain_text(PAYLOAD_MARK)

    for path in ("/", "/checks", "/queues/unknown", "/queues/quarantined", "/rejected"):
        page.goto(f"{site.url}{path}")
        site.snap(page, f"after-view-{path.strip('/').replace('/', '-') or 'overview'}")
    for t, tenant in enumerate(TENANTS):
        for op in site.ops:
            if op.startswith(f"op-raw-{t}-"):
                open_operation(page, site, tenant, op)
                site.snap(page, f"after-view-operation-{op}")
    assert site.count >= 5 + len(site.ops)
