"""How the pages show times, ages and charts: a time to the second in UTC inside a ``<time>``
element (the console's script shows it in the viewer's zone; hovering shows UTC), an age in
words, and a chart as an SVG with its axes, units and window, drawn on the server."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup, escape

CHART_WIDTH = 320
CHART_HEIGHT = 90
#: room for the axis labels: left (values), bottom (times)
LEFT = 44
BOTTOM = 18


def when(value: str | None) -> Markup:
    """An ISO time as ``<time>``, to the second, in UTC; empty for none."""
    if not value:
        return Markup("")
    try:
        at = datetime.fromisoformat(value).astimezone(UTC)
    except ValueError:
        return escape(value)
    shown = at.strftime("%Y-%m-%d %H:%M:%S UTC")
    return Markup('<time datetime="{0}" title="{1}">{1}</time>').format(
        at.isoformat(timespec="seconds"), shown
    )


def age(seconds: float | None) -> str:
    """An age in words, to the second: ``3d 4h``, ``2h 5m``, ``4m 2s``, ``12s``."""
    if seconds is None:
        return "none"
    whole = max(int(seconds), 0)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


@dataclass(frozen=True, slots=True)
class Chart:
    """One figure over the window: the line's points and its axes' labels."""

    name: str
    label: str
    unit: str
    points: str
    top: str
    start: str
    end: str
    window: str
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT
    left: int = LEFT
    bottom: int = BOTTOM


def chart(
    name: str,
    label: str,
    *,
    unit: str,
    values: Sequence[float | int | None],
    times: Sequence[str],
    window: str,
) -> Chart:
    """The chart of ``values`` (a missing value draws as 0) over ``times``: the y axis from 0
    to the largest value, labelled with the unit; the x axis from the first to the last time."""
    numbers = [float(v or 0) for v in values]
    top = max(numbers, default=0.0) or 1.0
    plot_w = CHART_WIDTH - LEFT
    plot_h = CHART_HEIGHT - BOTTOM
    step = plot_w / max(len(numbers) - 1, 1)
    points = " ".join(
        f"{LEFT + i * step:.1f},{plot_h - (n / top) * plot_h:.1f}" for i, n in enumerate(numbers)
    )
    clock = [datetime.fromisoformat(t).astimezone(UTC).strftime("%H:%M") for t in times[:1]]
    last = [datetime.fromisoformat(t).astimezone(UTC).strftime("%H:%M UTC") for t in times[-1:]]
    shown_top = f"{top:.0f}" if top >= 10 else f"{top:g}"
    return Chart(
        name=name,
        label=label,
        unit=unit,
        points=points,
        top=f"{shown_top} {unit}",
        start=clock[0] if clock else "",
        end=last[0] if last else "",
        window=window,
    )


def lookup_reason(found: Mapping[str, Any]) -> str | None:
    """What the latest lookup of the provider found, in words, when a lookup was made."""
    for a in reversed(found["attempts"]):
        if a["finding"]:
            words = {
                "applied": "applied: the provider has it",
                "not_applied": "not applied: the provider does not have it",
                "cannot_tell": "cannot tell: the provider did not say",
            }.get(a["finding"], a["finding"])
            error = f", error {a['error_class']}" if a["error_class"] else ""
            return f"{words} (attempt under fence {a['fence']}{error})"
    return None
