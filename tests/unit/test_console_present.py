"""How the console's pages show times, ages, charts and a lookup's finding, without a server."""

from __future__ import annotations

from bridge.console.present import age, chart, lookup_reason, when


def test_a_time_is_shown_to_the_second_in_utc_with_utc_on_hover() -> None:
    shown = str(when("2026-12-07T03:04:05.678901+01:00"))
    assert shown == (
        '<time datetime="2026-12-07T02:04:05+00:00" title="2026-12-07 02:04:05 UTC">'
        "2026-12-07 02:04:05 UTC</time>"
    )
    assert str(when(None)) == ""
    assert str(when("<script>")) == "&lt;script&gt;"


def test_an_age_reads_in_words() -> None:
    assert [age(s) for s in (None, 12.9, 242, 7500, 90000)] == [
        "none",
        "12s",
        "4m 2s",
        "2h 5m",
        "1d 1h",
    ]


def test_a_chart_has_its_axes_unit_and_window() -> None:
    times = ["2026-12-07T02:00:00+00:00", "2026-12-07T02:30:00+00:00", "2026-12-07T03:00:00+00:00"]
    drawn = chart(
        "stalled", "claimed but stalled", unit="rows", values=[0, 4, 2], times=times, window="1h"
    )
    assert (drawn.top, drawn.start, drawn.end, drawn.window) == (
        "4 rows",
        "02:00",
        "03:00 UTC",
        "1h",
    )
    first, middle, last = drawn.points.split()
    assert first.endswith(f",{drawn.height - drawn.bottom:.1f}")  # 0 on the x axis
    assert middle.endswith(",0.0")  # the top value at the top
    assert float(last.split(",")[0]) == drawn.width


def test_the_lookups_latest_finding_is_said_in_words() -> None:
    attempts = [
        {"finding": "not_applied", "fence": 1, "error_class": None},
        {"finding": "cannot_tell", "fence": 2, "error_class": "ProviderUnavailable"},
        {"finding": None, "fence": 3, "error_class": None},
    ]
    assert lookup_reason({"attempts": attempts}) == (
        "cannot tell: the provider did not say (attempt under fence 2, error ProviderUnavailable)"
    )
    assert lookup_reason({"attempts": []}) is None
