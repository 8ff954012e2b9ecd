"""Charts drawn on the server as inline SVG: no script, nothing to load, readable without JavaScript.

Every label is escaped; the markup is returned as ``markupsafe.Markup`` so templates insert it as is.

A bar may carry its 95% interval, drawn as an error bar: a vertical line from the low to the high end with a cap at
each, in an ``<g class="error-bar">`` whose ``data-low`` and ``data-high`` hold the ends as given (rates in 0..1) and
whose ``<title>`` states them. A bar without an interval gets no error bar (nothing is made up). The interval need not
be centred on the bar: a bar is the rate over every task, its interval is over the tasks the grading decided
(``services.results.estimates``), and the tooltip says over how many and around which mean.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from markupsafe import Markup

SERIES_COLOURS = ("#3b6fb6", "#2e9d6a", "#c7772a", "#8a5cc2", "#c24d5c", "#5a8f99")
"""Fill colours of the series, in order (colour-blind-safe enough side by side, and labelled in a legend)."""


@dataclass(frozen=True)
class Interval:
    """The 95% interval of a rate (``services.results.estimates.RateEstimate``'s fields): its ends, its mean and how
    many
    tasks it is over."""

    low: float
    high: float
    mean: float
    tasks: int


@dataclass(frozen=True)
class Series:
    """One series of a grouped bar chart: its name and one value in 0..1 (or None: not measured) per group, and
    optionally one interval per group (None where none is known)."""

    name: str
    values: Sequence[float | None]
    intervals: Sequence[Interval | None] | None = None


def _y(rate: float, top: float, plot: float) -> float:
    """Where ``rate`` (clipped to 0..1) sits on a plot ``plot`` high whose top is at ``top``."""
    return top + plot * (1 - min(1.0, max(0.0, rate)))


def _error_bar(interval: Interval, centre: float, top: float, plot: float, series: str, group: str) -> str:
    """The error bar of ``series``' bar in ``group``: at ``centre``, from ``interval.low`` to ``interval.high``, on a
    plot ``plot`` high from ``top``."""
    y_low, y_high = _y(interval.low, top, plot), _y(interval.high, top, plot)
    tip = (
        f"{escape(series)} · {escape(group)}: 95% CI {interval.low * 100:.1f}–{interval.high * 100:.1f}% "
        f"(mean {interval.mean * 100:.1f}% over the {interval.tasks} tasks decided)"
    )
    cap = 4
    return (
        f'<g class="error-bar" data-series="{escape(series)}" data-group="{escape(group)}" '
        f'data-low="{interval.low!r}" data-high="{interval.high!r}" stroke="#222" stroke-width="1.2">'
        f"<title>{tip}</title>"
        f'<line x1="{centre:.1f}" x2="{centre:.1f}" y1="{y_low:.1f}" y2="{y_high:.1f}"/>'
        f'<line x1="{centre - cap:.1f}" x2="{centre + cap:.1f}" y1="{y_low:.1f}" y2="{y_low:.1f}"/>'
        f'<line x1="{centre - cap:.1f}" x2="{centre + cap:.1f}" y1="{y_high:.1f}" y2="{y_high:.1f}"/></g>'
    )


def grouped_bars(groups: Sequence[str], series: Sequence[Series], *, title: str, height: int = 220) -> Markup:
    """A grouped bar chart of rates (0..1): one group per label, one bar per series, the value above each bar, and
    an error bar on each bar whose series gives an interval for it.

    Raises:
        ValueError: a series has not one value (or, when it has intervals, one interval) per group.
    """
    for one in series:
        if len(one.values) != len(groups):
            raise ValueError(f"series {one.name!r} has {len(one.values)} values for {len(groups)} groups")
        if one.intervals is not None and len(one.intervals) != len(groups):
            raise ValueError(f"series {one.name!r} has {len(one.intervals)} intervals for {len(groups)} groups")
    bar, gap, pad_left, pad_top, pad_bottom = 18, 22, 40, 28, 40
    group_width = max(1, len(series)) * bar + gap
    legend_width = sum(14 + 7 * len(one.name) + 18 for one in series)
    width = max(pad_left + len(groups) * group_width + 10, pad_left + legend_width)
    plot = height - pad_top - pad_bottom
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
    ]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = pad_top + plot * (1 - tick)
        parts.append(f'<line x1="{pad_left}" x2="{width - 6}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e6ea"/>')
        parts.append(
            f'<text x="{pad_left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="10" fill="#666">'
            f"{tick * 100:.0f}%</text>"
        )
    for g, label in enumerate(groups):
        x0 = pad_left + g * group_width + gap / 2
        for s, one in enumerate(series):
            value = one.values[g]
            x = x0 + s * bar
            colour = SERIES_COLOURS[s % len(SERIES_COLOURS)]
            if value is None:
                parts.append(
                    f'<text x="{x + bar / 2:.1f}" y="{pad_top + plot - 4:.1f}" text-anchor="middle" font-size="9" '
                    f'fill="#999">–</text>'
                )
                continue
            clipped = min(1.0, max(0.0, value))
            h = plot * clipped
            y = pad_top + plot - h
            centre = x + (bar - 3) / 2
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar - 3}" height="{h:.1f}" fill="{colour}">'
                f"<title>{escape(one.name)} · {escape(label)}: {value * 100:.1f}%</title></rect>"
            )
            interval = one.intervals[g] if one.intervals is not None else None
            label_y = y
            if interval is not None:
                parts.append(_error_bar(interval, centre, pad_top, plot, one.name, label))
                label_y = min(y, _y(interval.high, pad_top, plot))  # the value above the error bar's top
            parts.append(
                f'<text x="{centre:.1f}" y="{label_y - 3:.1f}" text-anchor="middle" font-size="9" '
                f'fill="#333">{value * 100:.0f}</text>'
            )
        parts.append(
            f'<text x="{x0 + len(series) * bar / 2:.1f}" y="{height - pad_bottom + 16}" text-anchor="middle" '
            f'font-size="11" fill="#222">{escape(label)}</text>'
        )
    legend_x = pad_left
    for s, one in enumerate(series):
        colour = SERIES_COLOURS[s % len(SERIES_COLOURS)]
        parts.append(f'<rect x="{legend_x}" y="{height - 14}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{legend_x + 14}" y="{height - 5}" font-size="11" fill="#222">{escape(one.name)}</text>')
        legend_x += 14 + 7 * len(one.name) + 18
    parts.append("</svg>")
    return Markup("".join(parts))
