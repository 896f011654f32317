"""Print strategy tables, write the raw results as JSON and the TTFT distribution as a PNG."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from e2e.bench.loadgen import Result, RunSummary


def table(summaries: Sequence[RunSummary], baseline: str | None = None) -> str:
    head = (
        f"{'strategy':<22}{'ok/n':>9}{'KV hit':>8}{'TTFT p50':>10}{'p90':>9}{'p99':>9}"
        f"{'req/s':>8}{'tok/s':>8}{'load CV':>9}"
    )
    if baseline:
        head += f"{'gain vs ' + baseline:>17}"
    lines = [head, "-" * len(head)]
    base = next((s for s in summaries if s.label == baseline), None)
    for s in summaries:
        row = (
            f"{s.label:<22}{f'{s.ok}/{s.n}':>9}{s.kv_hit_rate:>8.1%}{_ms(s.ttft_p50):>10}{_ms(s.ttft_p90):>9}"
            f"{_ms(s.ttft_p99):>9}{s.throughput_rps:>8.2f}{s.output_tok_s:>8.0f}{s.load_cv:>9.2f}"
        )
        if base is not None:
            ratio = s.ttft_p90 / base.ttft_p90 if base.ttft_p90 else float("nan")
            row += f"{ratio:>15.1f}x"
        lines.append(row)
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}ms" if seconds == seconds else "-"


def write_json(
    path: Path, summaries: Sequence[RunSummary], raw: dict[str, list[Result]], meta: dict[str, object]
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "meta": meta,
        "summaries": [s.as_dict() for s in summaries],
        "results": {k: [asdict(r) for r in v] for k, v in raw.items()},
    }
    path.write_text(json.dumps(doc, indent=1))


def plot_ttft(path: Path, raw: dict[str, list[Result]], title: str) -> None:
    """One empirical CDF of TTFT per strategy, log-scaled x (the distributions differ by orders of magnitude)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for label, results in raw.items():
        ttfts = sorted(r.ttft * 1000 for r in results if r.ttft is not None)
        if not ttfts:
            continue
        ys = [(i + 1) / len(ttfts) for i in range(len(ttfts))]
        ax.step(ttfts, ys, where="post", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
