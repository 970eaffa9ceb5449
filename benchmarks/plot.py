"""Draw docs/img/*.png from benchmarks/results/*.json.

Run: ``.venv/bin/python -m benchmarks.plot``
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

RESULTS = Path(__file__).parent / "results"
IMG = Path(__file__).parents[1] / "docs" / "img"


def load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def brokers(data: dict[str, Any]) -> None:
    rows = data["rows"]
    names = [r["broker"] for r in rows]
    series = [("raw client", "raw"), ("relay unordered", "unordered"), ("relay ordered", "ordered")]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.27
    for n, (label, key) in enumerate(series):
        xs = [i + (n - 1) * width for i in range(len(rows))]
        ax.bar(xs, [r[key] / 1000 for r in rows], width, label=label)
    ax.axhline(
        data_db := rows[0]["database"] / 1000,
        color="grey",
        linestyle=":",
        label=f"database ceiling ({data_db:.0f}k)",
    )
    ax.set_xticks(range(len(rows)), names)
    ax.set_ylabel("thousand messages / s")
    ax.set_title(f"{data['count']:,} messages, {data['keys']:,} keys, one relay, 2 cores")
    ax.legend()
    fig.tight_layout()
    fig.savefig(IMG / "brokers.png", dpi=110)


def backlog(data: dict[str, Any]) -> None:
    samples = data["per_second"]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot([t for t, _ in samples], [r / 1000 for _, r in samples], marker=".")
    ax.set_xlabel("seconds since the relay started")
    ax.set_ylabel("thousand messages / s")
    mib = 2**20
    ax.set_title(
        f"1M backlog, one relay: table {data['size_before'] / mib:.0f} MiB before, "
        f"{data['size_vacuumed'] / mib:.0f} MiB after VACUUM"
    )
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(IMG / "backlog.png", dpi=110)


def peers(data: dict[str, Any]) -> None:
    rows = data["rows"]
    series = [
        ("outboxer unordered", "unordered"),
        ("outboxer ordered (default)", "ordered"),
        ("txoutbox", "txoutbox"),
    ]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.27
    for n, (label, key) in enumerate(series):
        xs = [i + (n - 1) * width for i in range(len(rows))]
        ax.bar(xs, [r[key] / 1000 for r in rows], width, label=label)
    ax.set_xticks(range(len(rows)), [r["broker"] for r in rows])
    ax.set_ylabel("thousand messages / s")
    ax.set_title(
        f"{data['count']:,} pre-filled messages, {data['keys']:,} keys, one relay process, 2 cores"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(IMG / "peers.png", dpi=110)


def main() -> None:
    IMG.mkdir(parents=True, exist_ok=True)
    if (data := load("brokers")) is not None:
        brokers(data)
    if (data := load("peers")) is not None:
        peers(data)
    scaling = load("scaling") or load("scaling_backlog")
    if scaling is not None and "backlog" in scaling:
        backlog(scaling["backlog"])


if __name__ == "__main__":
    main()
