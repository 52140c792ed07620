"""One operation's spans drawn as a waterfall (SVG), for the picture in docs/telemetry.md.

The picture is made from a real run's exports (tests/acceptance/test_traced_operations.py
writes it when ``FENCEBRIDGE_TRACE_PICTURE`` names a file): one row per span, in the order
they started, indented under their parent, a bar from start to end on one time axis in
milliseconds. fencebridge's own spans are dark, the instrumentations' light, a span with the
error status is outlined in red; a link from a consumer span to the producer's is drawn as a
dashed line.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from tests.support.otlp import Span

ROW = 22
LABEL_WIDTH = 380
BAR_WIDTH = 560
TOP = 40


def _depth(span: Span, by_id: dict[str, Span]) -> int:
    depth = 0
    while span.parent_id in by_id:
        span = by_id[span.parent_id]
        depth += 1
    return depth


def _label(span: Span, ours: str) -> str:
    if span.scope == ours:
        return span.name
    library = span.scope.rsplit(".", 1)[-1]
    return f"{span.name} ({library})"


def render(spans: Sequence[Span], *, ours: str, title: str) -> str:
    """The SVG text of a waterfall of ``spans`` (at least one)."""
    if not spans:
        raise ValueError("a waterfall needs at least one span")
    rows = sorted(spans, key=lambda s: (s.start_ns, s.end_ns))
    by_id = {s.span_id: s for s in rows}
    start = min(s.start_ns for s in rows)
    end = max(s.end_ns for s in rows)
    scale = BAR_WIDTH / max(end - start, 1)
    width = LABEL_WIDTH + BAR_WIDTH + 80
    height = TOP + ROW * len(rows) + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="8" y="20" font-weight="bold">{escape(title)}</text>',
    ]
    place: dict[str, float] = {}
    for i, span in enumerate(rows):
        y = TOP + i * ROW
        x = LABEL_WIDTH + (span.start_ns - start) * scale
        w = max((span.end_ns - span.start_ns) * scale, 1.5)
        place[span.span_id] = y + ROW / 2
        indent = 8 + 14 * _depth(span, by_id)
        fill = "#2b5d8a" if span.scope == ours else "#9cc3e4"
        stroke = ' stroke="#c0392b" stroke-width="2"' if span.status == "STATUS_CODE_ERROR" else ""
        ms = (span.end_ns - span.start_ns) / 1e6
        out += [
            f'<text x="{indent}" y="{y + 15}">{escape(_label(span, ours))}</text>',
            f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="{ROW - 8}" '
            f'fill="{fill}"{stroke}>'
            f"<title>{escape(span.name)}: {ms:.1f} ms</title></rect>",
            f'<text x="{x + w + 4:.1f}" y="{y + 15}" fill="#555">{ms:.1f} ms</text>',
        ]
    for span in rows:
        for _trace, linked in span.links:
            if linked in place:
                out.append(
                    f'<line x1="{LABEL_WIDTH - 6}" y1="{place[linked]:.1f}" x2="{LABEL_WIDTH - 6}" '
                    f'y2="{place[span.span_id]:.1f}" stroke="#888" stroke-dasharray="3,3"/>'
                )
    axis = TOP + ROW * len(rows) + 12
    total_ms = (end - start) / 1e6
    out += [
        f'<line x1="{LABEL_WIDTH}" y1="{axis}" x2="{LABEL_WIDTH + BAR_WIDTH}" y2="{axis}" '
        'stroke="#333"/>',
        f'<text x="{LABEL_WIDTH}" y="{axis + 16}">0 ms</text>',
        f'<text x="{LABEL_WIDTH + BAR_WIDTH}" y="{axis + 16}" text-anchor="end">'
        f"{total_ms:.0f} ms</text>",
        "</svg>",
    ]
    return "\n".join(out) + "\n"
