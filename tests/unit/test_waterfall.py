"""The waterfall picture of one operation's spans: well-formed SVG, one row per span."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.support.otlp import Span
from tests.support.waterfall import render

DOCS = Path(__file__).resolve().parents[2] / "docs"
SVG = "{http://www.w3.org/2000/svg}"


def span(name: str, span_id: str, parent: str, start: int, end: int, **more: str) -> Span:
    scope = more.get("scope", "fencebridge")
    status = more.get("status", "STATUS_CODE_UNSET")
    return Span(name, scope, "t" * 32, span_id, parent, {}, status, start, end)


def test_each_span_is_a_row_indented_under_its_parent_and_errors_are_outlined() -> None:
    spans = [
        span("process orders", "a", "", 0, 10_000_000),
        span(
            "POST", "b", "a", 1_000_000, 3_000_000, scope="x.requests", status="STATUS_CODE_ERROR"
        ),
        span("reconcile <charge>", "c", "a", 4_000_000, 9_000_000),
    ]
    root = ET.fromstring(render(spans, ours="fencebridge", title="one & only"))
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "one & only" in texts
    assert "POST (requests)" in texts
    assert "reconcile <charge>" in texts, "names are escaped, not dropped"
    bars = [r for r in root.iter(f"{SVG}rect") if r.find(f"{SVG}title") is not None]
    assert len(bars) == len(spans)
    assert [b.get("stroke") for b in bars] == [None, "#c0392b", None]


def test_nothing_to_draw_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one span"):
        render([], ours="fencebridge", title="")


def test_the_docs_picture_is_well_formed_and_shown() -> None:
    picture = DOCS / "images" / "trace.svg"
    ET.parse(picture)
    assert "(images/trace.svg)" in (DOCS / "telemetry.md").read_text(encoding="utf-8")
