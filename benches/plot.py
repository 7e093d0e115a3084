"""Bar charts of the benchmark tables (benches/run.sh).

Usage: plot.py PLOT_DATA.json OUT_DIR

PLOT_DATA.json is written by `riffle-bench report --plot-data`: a list of
tables {mode, table, title, unit, series: [{key, label, hatch}], points:
[{system, label, values: {key: value}}], y_max?, reference?: [value,
label]}. Writes
OUT_DIR/{mode}-{table}.png, one grouped bar chart per table: one bar group
per system, one bar per series (log scale when the values differ by more
than 20x, unless y_max fixes a linear axis, as for hit ratios).
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3"]


def plot(table, out_dir):
    points = table["points"]
    if not points:
        return None
    series = [s for s in table["series"] if any(s["key"] in p["values"] for p in points)]
    if not series:
        return None
    # Plain series take the colours in order; a hatched series repeats the
    # colour of the plain one it mirrors (cold/warm without the proxy).
    plain = [s for s in series if not s["hatch"]]
    colors = {}
    for i, s in enumerate(plain):
        colors[s["key"]] = COLORS[i % len(COLORS)]
    for s in series:
        if s["hatch"]:
            base = s["key"].removeprefix("direct_")
            colors[s["key"]] = colors.get(base, COLORS[len(colors) % len(COLORS)])
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(points) + 2), 4.8))
    for i, s in enumerate(series):
        xs, ys = [], []
        for j, p in enumerate(points):
            v = p["values"].get(s["key"])
            if v is not None and (v > 0 or table.get("y_max")):
                xs.append(j + (i - (len(series) - 1) / 2) * width)
                ys.append(v)
        bars = ax.bar(xs, ys, width, label=s["label"], color=colors[s["key"]],
                      hatch="//" if s["hatch"] else None, alpha=0.55 if s["hatch"] else 1.0,
                      edgecolor="black", linewidth=0.4)
        for b, y in zip(bars, ys):
            text = f"{y:.2f}" if table.get("y_max") else (f"{y:.0f}" if y >= 100 else f"{y:.3g}")
            ax.annotate(text, (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(points)))
    ax.set_xticklabels([p.get("label") or p["system"] for p in points], fontsize=8)
    if table.get("y_max"):
        ax.set_ylim(0, table["y_max"] * 1.05)
        ax.set_ylabel(table["unit"])
    else:
        values = [v for p in points for v in p["values"].values() if v and v > 0]
        log = bool(values) and max(values) > 20 * min(values)
        if log:
            ax.set_yscale("log")
        scale = "log scale, " if log else ""
        ax.set_ylabel(f"{table['unit']} ({scale}higher is better)")
    if table.get("reference"):
        value, label = table["reference"]
        ax.axhline(value, color="grey", linestyle="--", linewidth=1, label=label)
    ax.set_title(table["title"], fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out_dir, f"{table['mode']}-{table['table']}.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        tables = json.load(f)
    os.makedirs(sys.argv[2], exist_ok=True)
    for t in tables:
        path = plot(t, sys.argv[2])
        if path:
            print(path)


if __name__ == "__main__":
    main()
