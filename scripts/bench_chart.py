"""The serving bench as a picture: load time per case, vLLM's default path against the fi-convert
plugin against the machine's limit (warm page cache; cold beside it where measured).

    python scripts/bench_chart.py bench-out/vllm-load-cuda.json [--png OUT.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def chart(path: str | Path, png: str | Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.loads(Path(path).read_text())
    caches = [c for c in ("warm", "cold") if any(r["cache"] == c for r in report["results"])]
    fig, axes = plt.subplots(
        1, len(caches), figsize=(7 * len(caches), 4.8), squeeze=False, sharey=False
    )
    sides = [
        ("vllm_s", "vLLM 0.33 default load + processing", "#9e9e9e"),
        ("plugin_s", "fi-convert plugin: read + kernel setup", "#1f77b4"),
        ("limit_s", "machine's limit (plain parallel copy)", "#2ca02c"),
    ]
    for ax, cache in zip(axes[0], caches, strict=True):
        rows = [r for r in report["results"] if r["cache"] == cache]
        width = 0.27
        for k, (key, label, color) in enumerate(sides):
            xs = [i + (k - 1) * width for i in range(len(rows))]
            ax.bar(xs, [r[key] for r in rows], width, label=label, color=color)
        for i, r in enumerate(rows):
            ax.annotate(
                f"{r['vllm_over_plugin']:.1f}x",
                (i, r["plugin_s"]),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=8,
                color="#1f77b4",
            )
        ax.set_xticks(range(len(rows)))
        labels = [f"{r['case']}\n{r['bytes'] / 1e9:.1f} GB" for r in rows]
        ax.set_xticklabels(labels, fontsize=7, rotation=20)
        ax.set_ylabel("seconds (lower is better)")
        ax.set_title(f"{cache} page cache, {report['device']}: label = vLLM / plugin")
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    out = Path(png) if png else Path(path).with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--png", default=None)
    a = ap.parse_args()
    print(chart(a.json, a.png))


if __name__ == "__main__":
    main()
