"""On call in a real browser, from "an unknown appeared" to "redriven with a reason" without the
command line: the overview shows what awaits a person with its oldest age, the failure groups
open a group whose redrive is previewed (a count) and confirmed with a reason; a queue row opens
its operation by a handle (no raw id in any URL), with the provider lookup's finding and times
in the viewer's zone; a conflict is closed from the operation page. The overview, a failure
group and an operation page are screenshotted into the docs (docs/images/console-*.png)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import psycopg
from playwright.sync_api import Page, expect

from tests.browser.conftest import OPERATOR, TENANTS, VIEWER_ZONE, Site, shown_time
from tests.browser.test_console_pages import assert_headers, log_in

Db = psycopg.Connection[Any]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "images"
REASON = "INC-77: provider recovered at 03:10"


def shot(page: Page, site: Site, name: str) -> None:
    """A screenshot for the docs, after the page's own checks (``snap``)."""
    site.snap(page, name)
    DOCS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=site.shots / f"docs-{name}.png", full_page=True)
    shutil.copyfile(site.shots / f"docs-{name}.png", DOCS / f"console-{name}.png")


def test_from_an_unknown_to_redriven_with_a_reason_without_the_cli(
    page: Page, site: Site, db: Db
) -> None:
    log_in(page, site, OPERATOR)
    unknown = page.locator('tr.awaiting[data-what="row"][data-kind="unknown"]')
    expect(unknown.locator("td.n")).to_have_text("2")
    conflicts = page.locator('tr.awaiting[data-what="delivery"][data-kind="conflict"]')
    expect(conflicts.locator("td.n")).to_have_text("1")
    expect(page.locator("svg[data-chart=stalled] text.tick")).to_have_count(4)
    expect(page.locator("#refresh")).to_contain_text("filters kept")
    shot(page, site, "overview")

    unknown.get_by_role("link", name="by cause").click()
    group = page.locator('tr.group[data-state="unknown"]')
    expect(group).to_have_count(1)
    group.get_by_role("link", name="open").click()
    expect(page.locator("#group-rows tr.row")).to_have_count(2)
    page.fill("#reason", REASON)
    page.get_by_role("button", name="Preview redrive").click()
    expect(page.get_by_test_id("group-preview")).to_contain_text("oldest 2 row(s)")
    assert db.execute("SELECT count(*) FROM redrive_audit").fetchone() == (0,)
    shot(page, site, "failure-group")
    page.get_by_role("button", name="Redrive 2 row(s) for real").click()
    expect(page.get_by_test_id("group-done")).to_contain_text("2 moved")
    assert db.execute("SELECT count(*), min(actor), min(reason) FROM redrive_audit").fetchone() == (
        2,
        "olga",
        REASON,
    )
    assert "tenant-raw" not in page.url
    assert_headers(site)


def test_a_row_opens_its_operation_and_a_conflict_is_closed_from_it(
    page: Page, site: Site, db: Db
) -> None:
    log_in(page, site, OPERATOR)
    page.goto(f"{site.url}/rejected?kind=conflict")
    page.locator("tr.rejected").get_by_role("link", name="open").click()
    assert all(t not in page.url for t in TENANTS)
    expect(page.locator("#operation h2")).to_contain_text("Operation op_")
    (created,) = db.execute(  # type: ignore[misc]
        "SELECT created_at FROM work_item WHERE tenant_id = %s AND operation_id = 'op-raw-0-0'",
        (TENANTS[0],),
    ).fetchone()
    when = page.locator("dl.row time").first
    expect(when).to_have_text(shown_time(created))
    assert VIEWER_ZONE
    expect(when).to_have_attribute("title", created.strftime("%Y-%m-%d %H:%M:%S UTC"))
    shot(page, site, "operation")

    page.locator("form.resolve input[name=reason]").fill("producer told: INC-78")
    page.get_by_role("button", name="Preview close").click()
    expect(page.get_by_test_id("resolve-preview")).to_contain_text("stops awaiting a person")
    page.get_by_role("button", name="Close it").click()
    expect(page.get_by_test_id("resolve-done")).to_contain_text("Closed")
    assert db.execute(
        "SELECT resolved_by, resolution_reason FROM rejected_delivery WHERE kind = 'conflict'"
    ).fetchall() == [("olga", "producer told: INC-78")]
    assert_headers(site)


def test_a_queue_refreshes_itself_and_keeps_its_filters(page: Page, site: Site) -> None:
    log_in(page, site, OPERATOR)
    page.goto(f"{site.url}/queues/unknown?job_type=mail")
    page.get_by_role("link", name="30 s").click()
    assert page.url.endswith("/queues/unknown?job_type=mail&every=30")
    expect(page.locator('meta[http-equiv="refresh"]')).to_have_attribute("content", "30")
    expect(page.locator("#job_type")).to_have_value("mail")
    page.locator("tr.row").first.get_by_role("link", name="open").click()
    expect(page.get_by_test_id("state")).to_have_text("unknown")
    expect(page.locator("#redrive")).to_have_count(1)
