"""Bar charts of the benchmark tables (benches/run.sh).

Usage: plot.py PLOT_DATA.json OUT_DIR

PLOT_DATA.json is written by `riffle-bench report --plot-data`: a list of
tables {mode, table, title, unit, points: [{system, cold, warm, direct_cold,
direct_warm}]}. Writes OUT_DIR/{mode}-{table}.png, one grouped bar chart per
table (log scale when the systems differ by more than 20x, else linear).
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES = [
    ("cold", "cold (proxy)", "#4c72b0", None),
    ("warm", "warm (proxy)", "#dd8452", None),
    ("direct_cold", "cold (no proxy)", "#4c72b0", "//"),
    ("direct_warm", "warm (no proxy)", "#dd8452", "//"),
]


def plot(table, out_dir):
    points = table["points"]
    if not points:
        return None
    series = [s for s in SERIES if any(p.get(s[0]) for p in points)]
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(10, 4.8))
    for i, (key, label, color, hatch) in enumerate(series):
        xs, ys = [], []
        for j, p in enumerate(points):
            if p.get(key):
                xs.append(j + (i - (len(series) - 1) / 2) * width)
                ys.append(p[key])
        bars = ax.bar(xs, ys, width, label=label, color=color, hatch=hatch,
                      alpha=0.55 if hatch else 1.0, edgecolor="black", linewidth=0.4)
        for b, y in zip(bars, ys):
            ax.annotate(f"{y:.0f}" if y >= 100 else f"{y:.3g}", (b.get_x() + b.get_width() / 2, y),
                        ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(points)))
    ax.set_xticklabels([p["system"] for p in points])
    values = [p[k] for p in points for k, *_ in series if p.get(k)]
    log = bool(values) and max(values) > 20 * min(values)
    if log:
        ax.set_yscale("log")
    scale = "log scale, " if log else ""
    ax.set_ylabel(f"{table['unit']} ({scale}higher is better)")
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
