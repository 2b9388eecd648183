"""The report step: a load generator or scenario JSON document → Markdown table + PNG plot.

A document is ``{"command", "machine", "started", "series": [...], "targets"?: [...]}`` (see
:func:`bench.perf.loadgen.document`); each series holds points from
:func:`bench.perf.loadgen.measure`. Series are grouped into plot rows by their ``group`` (the
scenario sets it, e.g. per model), else by model. A group swept over several concurrency levels
is drawn as lines (throughput, and p50 solid / p99 dashed latency, against concurrency on a log₂
axis); a group measured at one level as bars.

    .venv/bin/python -m bench.perf.report result.json [--out DIR] [--name NAME]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _fmt(value, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _level(point: dict) -> str:
    return f"c{point['concurrency']}" if point["mode"] == "concurrency" else f"{point['rate']:g}/s"


def table(series: list[dict]) -> str:
    """One row per point: throughput, latency percentiles, errors, client and server CPU."""
    head = ["series", "load", "req/s", "p50 ms", "p90 ms", "p99 ms", "errors", "client CPU", "server CPU"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for s in series:
        for p in s["points"]:
            lat = p["latency_ms"]
            cells = [
                s["label"],
                _level(p),
                _fmt(p["throughput_rps"], 0),
                _fmt(lat["p50"]),
                _fmt(lat["p90"]),
                _fmt(lat["p99"]),
                str(p["errors"] + p.get("dropped", 0)),
                _fmt(p["client_cpu"]),
                _fmt(p["server_cpu"]),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: The cost table's CPU columns: process kinds of :mod:`bench.perf.costs`.
COST_KINDS = ("server", "redis-server", "worker", "python stub")


def costs_table(series: list[dict]) -> str:
    """One row per point that has ``costs``: CPU µs per request per process kind and in all,
    Redis commands and read events (round trips) per request, batches: mean size and the
    share of batches of one request. '' when no point has them."""
    head = ["series", "load", "req/s", *(f"{k} µs/req" for k in COST_KINDS), "total µs/req",
            "Redis cmds/req", "Redis reads/req", "mean batch", "batches of 1"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for s in series:
        for p in (p for p in s["points"] if p.get("costs")):
            c = p["costs"]
            cpu, redis, batches = c.get("cpu_us_per_request", {}), c.get("redis", {}), c.get("batches", {})
            ones = None
            if batches.get("executed"):
                ones = batches["by_size"].get("1", 0) / batches["executed"]
            cells = [s["label"], _level(p), _fmt(p["throughput_rps"], 0),
                     *(_fmt(cpu.get(k), 0) for k in COST_KINDS), _fmt(sum(cpu.values()) if cpu else None, 0),
                     _fmt(redis.get("commands_per_request")), _fmt(redis.get("reads_per_request")),
                     _fmt(batches.get("mean_size")), "–" if ones is None else f"{ones:.0%}"]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def targets_table(targets: list[dict]) -> str:
    head = ["target", "measured", "goal", "met"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for t in targets:
        met = "–" if t["met"] is None else ("yes" if t["met"] else "**no**")
        if t["met"] is False and t.get("must_met"):
            met = "must only"
        lines.append(f"| {t['name']} | {_fmt(t['value'])} | {t['goal']} | {met} |")
    return "\n".join(lines)


def markdown(doc: dict, title: str | None = None, plot_name: str | None = None) -> str:
    m = doc["machine"]
    parts = [
        f"## {title or doc.get('scenario', 'Load generator run')}",
        "",
        f"Command: `{doc['command']}`  ",
        f"Started {doc['started']}; machine: nproc {m['nproc']}, "
        f"CPU {m['cpu']}, Python {m['python']}, load average (1 min) at start {m['load_avg_1m_at_start']}.",
        "",
        table(doc["series"]),
    ]
    costs = costs_table(doc["series"])
    if costs:
        parts += ["", "Cost per request (CPU µs by process kind, Redis, batches: bench/perf/costs.py):", "",
                  costs]
    if doc.get("targets"):
        parts += ["", targets_table(doc["targets"])]
    for note in doc.get("notes", []):
        parts += ["", note]
    if plot_name:
        parts += ["", f"![{title or 'plot'}]({plot_name})"]
    return "\n".join(parts) + "\n"


def _groups(series: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for s in series:
        groups.setdefault(s.get("group") or s["target"]["model"], []).append(s)
    return groups


def plot(doc: dict, path: Path) -> None:
    """A PNG: one row per group, throughput (left) and latency (right)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    groups = _groups(doc["series"])
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 3.6 * len(groups)), squeeze=False)
    for row, (group, series) in enumerate(groups.items()):
        swept = any(len({p.get("concurrency") for p in s["points"]}) > 1 for s in series)
        (_lines if swept else _bars)(axes[row][0], axes[row][1], series)
        axes[row][0].set_title(f"{group}: throughput")
        axes[row][1].set_title(f"{group}: latency")
    fig.suptitle(doc.get("scenario", ""), fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _lines(ax_tp, ax_lat, series: list[dict]) -> None:
    for s in series:
        points = [p for p in s["points"] if p["mode"] == "concurrency" and p["requests"]]
        xs = [p["concurrency"] for p in points]
        (line,) = ax_tp.plot(xs, [p["throughput_rps"] for p in points], marker="o", label=s["label"])
        ax_lat.plot(
            xs,
            [p["latency_ms"]["p50"] for p in points],
            marker="o",
            color=line.get_color(),
            label=f"{s['label']} p50",
        )
        ax_lat.plot(
            xs,
            [p["latency_ms"]["p99"] for p in points],
            linestyle="--",
            color=line.get_color(),
            label=f"{s['label']} p99",
        )
    levels = sorted({p["concurrency"] for s in series for p in s["points"] if p["mode"] == "concurrency"})
    for ax, label in ((ax_tp, "requests/s"), (ax_lat, "ms")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(level) for level in levels])
        ax.set_xlabel("concurrency")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    ax_tp.set_ylim(bottom=0)
    ax_lat.set_yscale("log")
    ax_tp.legend(fontsize=8)
    ax_lat.legend(fontsize=7, ncol=2)


def _bars(ax_tp, ax_lat, series: list[dict]) -> None:
    labels = [f"{s['label']} {_level(s['points'][0])}" for s in series]
    xs = range(len(series))
    ax_tp.bar(xs, [s["points"][0]["throughput_rps"] for s in series], color="tab:blue")
    width = 0.27
    for offset, key in ((-width, "p50"), (0, "p90"), (width, "p99")):
        ax_lat.bar(
            [x + offset for x in xs],
            [s["points"][0]["latency_ms"][key] or 0 for s in series],
            width,
            label=key,
        )
    for ax, label in ((ax_tp, "requests/s"), (ax_lat, "ms")):
        ax.set_xticks(list(xs), labels, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
    ax_lat.legend(fontsize=8)


def write(doc: dict, out_dir: Path, name: str, title: str | None = None) -> dict[str, Path]:
    """``NAME.json``, ``NAME.md`` and ``NAME.png`` in ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {ext: out_dir / f"{name}.{ext}" for ext in ("json", "md", "png")}
    paths["json"].write_text(json.dumps(doc, indent=1) + "\n")
    plot(doc, paths["png"])
    paths["md"].write_text(markdown(doc, title, paths["png"].name))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_file", type=Path)
    parser.add_argument("--out", type=Path, help="folder (default: the JSON file's)")
    parser.add_argument("--name", help="file stem (default: the JSON file's)")
    args = parser.parse_args()
    doc = json.loads(args.json_file.read_text())
    paths = write(doc, args.out or args.json_file.parent, args.name or args.json_file.stem)
    print(paths["md"].read_text())


if __name__ == "__main__":
    main()
