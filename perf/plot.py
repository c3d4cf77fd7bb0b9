"""SVG plot of the benchmark matrix: built payload throughput against the number of
sources, one line per fragment size and datagram size, push and pull side by side,
with the machine limits of the same run as reference lines. Standard library only.

Used by perf/bench_e2e.py; on its own: python3 perf/plot.py results.json > out.svg
"""
import json
import math
import sys
from xml.sax.saxutils import escape

GB = 1e9
PANEL_W, PANEL_H = 430, 300  # plot area of one panel, in px
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 70, 120, 50, 55
LEGEND_H = 70
FRAGMENT_COLOURS = {256: "#1f77b4", 4096: "#ff7f0e", 65536: "#2ca02c"}
OTHER_COLOUR = "#9467bd"
DASH = {1472: "6,4", 8972: ""}  # 1472-byte datagrams dashed, jumbo solid


def size_label(n):
    return f"{n // 1024} KiB" if n % 1024 == 0 else f"{n} B"


def nice_ceiling(x):
    """The smallest 1, 2 or 5 x 10^k not below x."""
    if x <= 0:
        return 1.0
    base = 10 ** math.floor(math.log10(x))
    for step in (1, 2, 5, 10):
        if step * base >= x:
            return step * base
    return 10 * base


def series_of(runs, mode):
    """{(datagram_bytes, fragment): [(sources, GB/s), ...]} for the matrix runs of one mode;
    repeated runs of one point (name#2) are averaged."""
    points = {}
    for r in runs:
        if r["group"] == "matrix" and r["mode"] == mode:
            key = (1472 if r["chunk"] == 1432 else 8972, r["fragment"])
            points.setdefault((key, r["sources"]), []).append(r["payload_bytes_per_s"] / GB)
    series = {}
    for (key, sources), rates in points.items():
        series.setdefault(key, []).append((sources, sum(rates) / len(rates)))
    return {k: sorted(v) for k, v in sorted(series.items())}


def throughput_svg(runs, limits):
    """The SVG document, or None when there are no matrix runs."""
    panels = [(mode, series_of(runs, mode)) for mode in ("push", "pull")]
    panels = [(mode, s) for mode, s in panels if s]
    if not panels:
        return None
    references = [("loopback 8972 B", limits["loopback_8972"]["bytes_per_s"] / GB, "#555555"),
                  ("loopback 1472 B", limits["loopback_1472"]["bytes_per_s"] / GB, "#aaaaaa")]
    direct = limits.get("disk_direct_bytes_per_s")
    if isinstance(direct, (int, float)):
        references.append(("disk O_DIRECT", direct / GB, "#8c564b"))
    top = max([y for _, s in panels for pts in s.values() for _, y in pts] + [v for _, v, _ in references])
    y_max = nice_ceiling(top * 1.05)
    x_values = sorted({x for _, s in panels for pts in s.values() for x, _ in pts})
    x_lo, x_hi = math.log10(min(x_values)), math.log10(max(x_values))

    width = len(panels) * (MARGIN_L + PANEL_W + MARGIN_R)
    height = MARGIN_T + PANEL_H + MARGIN_B + LEGEND_H
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    keys = []
    for i, (mode, series) in enumerate(panels):
        ox = i * (MARGIN_L + PANEL_W + MARGIN_R) + MARGIN_L
        oy = MARGIN_T

        def px(sources):
            if x_hi == x_lo:
                return ox + PANEL_W / 2
            return ox + (math.log10(sources) - x_lo) / (x_hi - x_lo) * PANEL_W

        def py(gb_per_s):
            return oy + PANEL_H - gb_per_s / y_max * PANEL_H

        out.append(f'<text x="{ox + PANEL_W / 2}" y="{oy - 20}" text-anchor="middle" font-size="14" '
                   f'font-weight="bold">{mode}: built payload throughput</text>')
        for k in range(6):  # horizontal grid and y labels
            v = y_max * k / 5
            out.append(f'<line x1="{ox}" y1="{py(v):.1f}" x2="{ox + PANEL_W}" y2="{py(v):.1f}" stroke="#e0e0e0"/>')
            out.append(f'<text x="{ox - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
        for x in x_values:
            out.append(f'<line x1="{px(x):.1f}" y1="{oy + PANEL_H}" x2="{px(x):.1f}" y2="{oy + PANEL_H + 5}" '
                       f'stroke="black"/>')
            out.append(f'<text x="{px(x):.1f}" y="{oy + PANEL_H + 18}" text-anchor="middle">{x}</text>')
        out.append(f'<rect x="{ox}" y="{oy}" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="black"/>')
        out.append(f'<text x="{ox + PANEL_W / 2}" y="{oy + PANEL_H + 38}" text-anchor="middle">'
                   f'sources (log scale)</text>')
        out.append(f'<text transform="translate({ox - 50},{oy + PANEL_H / 2}) rotate(-90)" '
                   f'text-anchor="middle">GB/s (10⁹ bytes)</text>')
        for label, value, colour in references:
            out.append(f'<line x1="{ox}" y1="{py(value):.1f}" x2="{ox + PANEL_W}" y2="{py(value):.1f}" '
                       f'stroke="{colour}" stroke-dasharray="2,3"/>')
            out.append(f'<text x="{ox + PANEL_W + 4}" y="{py(value) + 4:.1f}" fill="{colour}">'
                       f'{escape(label)}</text>')
        for (datagram, fragment), pts in series.items():
            colour = FRAGMENT_COLOURS.get(fragment, OTHER_COLOUR)
            dash = DASH.get(datagram, "")
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"'
                       + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
            for x, y in pts:
                out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}">'
                           f'<title>{mode}, {datagram} B datagrams, {size_label(fragment)} fragments, '
                           f'{x} sources: {y:.3f} GB/s</title></circle>')
            if (datagram, fragment) not in keys:
                keys.append((datagram, fragment))

    ly = MARGIN_T + PANEL_H + MARGIN_B + 10
    for j, (datagram, fragment) in enumerate(keys):
        lx = MARGIN_L + (j % 3) * 310
        row_y = ly + (j // 3) * 20
        colour = FRAGMENT_COLOURS.get(fragment, OTHER_COLOUR)
        dash = DASH.get(datagram, "")
        out.append(f'<line x1="{lx}" y1="{row_y}" x2="{lx + 30}" y2="{row_y}" stroke="{colour}" stroke-width="2"'
                   + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        out.append(f'<text x="{lx + 36}" y="{row_y + 4}">{size_label(fragment)} fragments, '
                   f'{datagram} B datagrams</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    svg = throughput_svg(doc["runs"], doc["limits"])
    if svg is None:
        sys.exit("no matrix runs in " + sys.argv[1])
    sys.stdout.write(svg)
