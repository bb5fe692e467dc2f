"""The unallocated-GPU curve per arrival level: table text and an SVG plot (hand-written,
no plotting dependency)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import mean

from hami.simulate.engine import Placement, unallocated

LEVELS = (90, 100, 110, 130)
# FGD's and BestFit's 10-seed means at k = 100 per openb pod list, split count not binding:
# the paper's Fig. 9a for the default list (FGD, USENIX ATC '23), and its authors' own
# results for every list (hkust-adsl/kubernetes-scheduler-simulator,
# experiments/analysis/expected_results/analysis_allo_discrete.csv: 100 - allocation % at
# arrival 100, 06-FGD and 05-BestFit, seeds 42-51).
PUBLISHED_BY_LIST = {
    "openb_pod_list_default.csv": {"FGD (published)": 4.77, "BestFit (published)": 7.14},
    "openb_pod_list_gpushare100.csv": {"FGD (published)": 13.36, "BestFit (published)": 15.38},
    "openb_pod_list_multigpu50.csv": {"FGD (published)": 2.91, "BestFit (published)": 4.38},
    "openb_pod_list_gpuspec33.csv": {"FGD (published)": 12.16, "BestFit (published)": 19.61},
}
PUBLISHED = PUBLISHED_BY_LIST["openb_pod_list_default.csv"]


def at_level(placements: Sequence[Placement], capacity: int, level: float) -> float | None:
    """Unallocated GPU % right after the first pod whose arrival brings the requested GPU
    demand to ``level`` % of capacity; None when the workload never gets there."""
    target = level * capacity / 100
    for placement in placements:
        if placement.arrived >= target:
            return unallocated(placement.used, capacity)
    return None


def curve(
    placements: Sequence[Placement], capacity: int, step: float = 1.0
) -> list[tuple[float, float]]:
    """(arrival %, unallocated %) at every ``step`` % of arrival the run reached."""
    points: list[tuple[float, float]] = []
    level = step
    for placement in placements:
        while capacity and placement.arrived >= level * capacity / 100:
            points.append((level, unallocated(placement.used, capacity)))
            level += step
    return points


def mean_of(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return mean(known) if known and len(known) == len(values) else None


def table(rows: Mapping[str, Sequence[float | None]], levels: Sequence[float] = LEVELS) -> str:
    """One row per policy: unallocated GPU % at each arrival level."""
    width = max([len("policy"), *(len(name) for name in rows)])
    head = f"{'policy':<{width}}  " + "  ".join(f"k={level:>5g}" for level in levels)
    lines = [head, "-" * len(head)]
    for name, values in rows.items():
        cells = "  ".join(f"{'-' if v is None else f'{v:.2f}':>7}" for v in values)
        lines.append(f"{name:<{width}}  {cells}")
    return "\n".join(lines)


_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf")


def svg(curves: Mapping[str, Sequence[tuple[float, float]]], *, title: str) -> str:
    """A line chart: arrival % (x) against unallocated GPU % (y), one line per policy."""
    width, height, left, right, top, bottom = 720, 440, 60, 230, 40, 50
    xs = [x for points in curves.values() for x, _ in points] or [0.0, 100.0]
    ys = [y for points in curves.values() for _, y in points] or [0.0, 100.0]
    x0, x1 = 0.0, max(xs)
    y0, y1 = 0.0, max(max(ys), 1.0)
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1) * plot_w

    def py(y: float) -> float:
        return top + plot_h - (y - y0) / ((y1 - y0) or 1) * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="20" font-size="14">{_escape(title)}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
        'stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="black"/>',
        f'<text x="{left + plot_w / 2}" y="{height - 12}" text-anchor="middle">'
        "arrived GPU demand (% of capacity)</text>",
        f'<text x="16" y="{top + plot_h / 2}" transform="rotate(-90 16 {top + plot_h / 2})" '
        'text-anchor="middle">unallocated GPU %</text>',
    ]
    for i in range(6):
        x = x0 + (x1 - x0) * i / 5
        y = y0 + (y1 - y0) * i / 5
        out.append(
            f'<text x="{px(x):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{x:.0f}</text>'
        )
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.0f}</text>')
    for n, (name, points) in enumerate(curves.items()):
        colour = _COLOURS[n % len(_COLOURS)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{path}"/>')
        ly = top + 14 + 18 * n
        out.append(
            f'<line x1="{width - right + 10}" y1="{ly - 4}" x2="{width - right + 30}" '
            f'y2="{ly - 4}" stroke="{colour}" stroke-width="2"/>'
        )
        out.append(f'<text x="{width - right + 36}" y="{ly}">{_escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
