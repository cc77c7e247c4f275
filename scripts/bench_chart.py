"""The serving bench as a picture: load time per case, the server's default path against the
fi-convert plugin against the machine's limit (warm page cache; cold beside it where measured).

    python scripts/bench_chart.py bench-out/vllm-load-cuda.json [MORE.json ...] [--png OUT.png]
        [--device NAME]

Several JSON files (runs of scripts/bench_vllm_load.py, or of scripts/bench_sglang_load.py)
go into one picture; each case is labelled with the plugin's read settings (threads x chunk)
of its run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _results(paths: list[Path]) -> tuple[str, str, list[dict]]:
    rows, device, server = [], "", ""
    for path in paths:
        report = json.loads(path.read_text())
        device, server = report.get("gpu", report["device"]), report.get("server", "vLLM 0.33")
        for r in report["results"]:
            plugin = r["runs"]["plugin"][0]
            how = f"{plugin['threads']}x{plugin['chunk'] >> 20} MiB" if "threads" in plugin else ""
            rows.append(
                r
                | {
                    "label": f"{r['case']}\n{r['bytes'] / 1e9:.1f} GB {how}",
                    # the server's default path (vLLM's JSON names it so)
                    "default_s": r.get("default_s", r.get("vllm_s")),
                    "ratio": r.get("default_over_plugin", r.get("vllm_over_plugin")),
                }
            )
    return device, server, rows


def chart(
    path: str | Path | list, png: str | Path | None = None, device: str | None = None
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = [Path(p) for p in (path if isinstance(path, list) else [path])]
    found, server, results = _results(paths)
    device = device or found
    caches = [c for c in ("warm", "cold") if any(r["cache"] == c for r in results)]
    fig, axes = plt.subplots(
        1, len(caches), figsize=(7 * len(caches), 4.8), squeeze=False, sharey=False
    )
    sides = [
        ("default_s", f"{server} default load + processing", "#9e9e9e"),
        ("plugin_s", "fi-convert plugin: read + kernel setup", "#1f77b4"),
        ("limit_s", "machine's limit (plain parallel copy)", "#2ca02c"),
    ]
    for ax, cache in zip(axes[0], caches, strict=True):
        rows = [r for r in results if r["cache"] == cache]
        width = 0.27
        for k, (key, label, color) in enumerate(sides):
            xs = [i + (k - 1) * width for i in range(len(rows))]
            ax.bar(xs, [r[key] for r in rows], width, label=label, color=color)
        for i, r in enumerate(rows):
            ax.annotate(
                f"{r['ratio']:.1f}x",
                (i, r["plugin_s"]),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=8,
                color="#1f77b4",
            )
            ax.annotate(
                f"{r['plugin_s'] / r['limit_s']:.2f}",
                (i + width, r["limit_s"]),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color="#2ca02c",
            )
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([r["label"] for r in rows], fontsize=6.5, rotation=25, ha="right")
        ax.set_ylabel("seconds (lower is better)")
        name = server.split()[0]
        ax.set_title(
            f"{cache} page cache, {device}: above the bars, {name} / plugin (blue) "
            "and plugin / limit (green)",
            fontsize=9,
        )
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    out = Path(png) if png else paths[0].with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+")
    ap.add_argument("--png", default=None)
    ap.add_argument("--device", default=None, help="the machine's name in the title")
    a = ap.parse_args()
    print(chart(a.json, a.png, a.device))


if __name__ == "__main__":
    main()
