"""What every model is doing now: the data of ``naiad status`` and of the gateway's page at ``/``.

:func:`status_snapshot` reads Redis only (no transport, no web framework): the registry for
the models and their versions, :func:`naiad.telemetry.snapshot` for the counters the metrics
endpoint also shows (statistics, cold starts, queue length, live heartbeats), and one
``XPENDING`` per model for the requests a worker has claimed and not answered yet. Each model
gets a ``state``:

- ``asleep``: no worker and nothing queued (scaled to zero; costs nothing);
- ``waking``: requests queued but no worker yet (a cold start is under way);
- ``busy``: workers up, and requests queued or running or one answered in the last
  :data:`BUSY_WINDOW_S` seconds (a fast model's queue is empty most of the time);
- ``idle``: workers up, nothing for that long (they exit after ``--idle-timeout``);
- ``unavailable``: the registry entry is not READY (``reason`` says why).

``problem`` says what is wrong even while the model serves: a change (poll, explicit load)
that failed while the previous one keeps serving, or versions that failed to load
(``failed_versions``); ``load_failures`` counts such failed changes.

Latency percentiles (p50, p99) are estimated from the request-duration histogram the
gateway keeps per model version (:data:`naiad.stats.REQUEST_BUCKETS_S`), by linear
interpolation within a bucket as Prometheus's ``histogram_quantile`` does; the mean comes
from Triton's statistics (summed duration over count). :func:`run_status` draws the snapshot
with ``rich`` (a table, refreshed in place).
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from naiad import keys, queue_policy, rollout, telemetry
from naiad.registry import ModelEntry, RegistryReader
from repository_store import resolve_ensembles

STATES = ("asleep", "waking", "busy", "idle", "unavailable")
#: Seconds after its last inference that a model with workers still counts as busy.
BUSY_WINDOW_S = 5.0


def _state(entry: ModelEntry, workers: int, queue: int, last_inference_ms: int, now: float) -> str:
    if not entry.ready:
        return "unavailable"
    if workers == 0:
        return "waking" if queue else "asleep"
    recent = now - last_inference_ms / 1000 < BUSY_WINDOW_S
    return "busy" if queue or recent else "idle"


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _model_row(
    entry: ModelEntry, tele: telemetry.ModelTelemetry, in_flight: int, now: float
) -> dict[str, Any]:
    def total(kind: str, unit: str) -> int:
        return sum(s["inference_stats"][kind][unit] for s in tele.stats)

    success, success_ns = total("success", "count"), total("success", "ns")
    hits, misses = total("cache_hit", "count"), total("cache_miss", "count")
    cold = tele.cold_starts
    last_ms = max((s["last_inference"] for s in tele.stats), default=0)
    queue = max(tele.queue_depth, in_flight)  # two round trips: a claim may fall between them
    return {
        "name": entry.name,
        "state": _state(entry, tele.workers, queue, last_ms, now),
        "reason": entry.reason,
        "problem": entry.problem,
        "versions": [str(v) for v in entry.versions],
        "failed_versions": {str(v): why for v, why in sorted(entry.failed.items())},
        "load_failures": tele.load_failures,
        "workers": tele.workers,
        "queue": queue,
        "in_flight": in_flight,
        "success": success,
        "failure": sum(sum(reasons.values()) for reasons in tele.failures.values()),
        "inferences": sum(s["inference_count"] for s in tele.stats),
        "executions": sum(s["execution_count"] for s in tele.stats),
        "avg_latency_ms": success_ns / success / 1e6 if success else None,
        "p50_ms": _ms(tele.request_durations.quantile(0.5)),
        "p99_ms": _ms(tele.request_durations.quantile(0.99)),
        "cache_hits": hits,
        "cache_misses": misses,
        "cache_hit_ratio": _ratio(hits, hits + misses),
        "cold_starts": cold.count,
        "cold_start_avg_s": cold.sum / cold.count if cold.count else None,
        "last_inference_ms": last_ms,
    }


def _version_rows(
    entry: ModelEntry, tele: telemetry.ModelTelemetry, rolled_back: dict[int, str]
) -> list[dict[str, Any]]:
    """One row per version served, failed or in the split: its configured ``weight`` and the
    ``share`` it gets now (rollbacks taken out; None without a split), its ``state``
    (``serving``, ``failed``, ``rolled back``), its requests, error ratio and mean latency."""
    policy, _ = rollout.policy_of(entry.config, entry.versions) if entry.ready else (rollout.NONE, [])
    weights, shares = dict(policy.split), dict(rollout.without(policy.split, set(rolled_back)))
    stats_by_version = {int(s["version"]): s for s in tele.stats}
    rows = []
    for version in sorted({*entry.versions, *entry.failed, *weights}):
        stat = stats_by_version.get(version)
        ok = stat["inference_stats"]["success"]["count"] if stat else 0
        ok_ns = stat["inference_stats"]["success"]["ns"] if stat else 0
        failed = sum(tele.failures.get(version, {}).values())
        state = "serving"
        if version in entry.failed or version in rolled_back:
            state = "failed" if version in entry.failed else "rolled back"
        rows.append({
            "version": str(version), "state": state, "weight": weights.get(version),
            "share": shares.get(version, 0) if weights else None,
            "success": ok, "failure": failed, "error_ratio": _ratio(failed, ok + failed),
            "avg_latency_ms": ok_ns / ok / 1e6 if ok else None,
            "reason": entry.failed.get(version) or rolled_back.get(version, ""),
        })  # fmt: skip
    return rows


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


async def _in_flight(redis: Redis, streams: list[list[str]]) -> list[int]:
    """Entries each model's workers claimed and have not acknowledged (XPENDING), summed
    over the model's ``streams`` (one per priority level)."""
    async with redis.pipeline(transaction=False) as pipe:
        for stream in (s for names in streams for s in names):
            pipe.xpending(stream, keys.WORKER_GROUP)
        replies = await pipe.execute(raise_on_error=False)
    # NOGROUP: no worker ever ran for the model, so nothing can be claimed.
    counts = [0 if isinstance(r, ResponseError) else int(r["pending"]) for r in replies]
    ends = list(itertools.accumulate(len(names) for names in streams))
    return [sum(counts[end - len(names) : end]) for names, end in zip(streams, ends, strict=True)]


async def _rollbacks(redis: Redis, entries: list[ModelEntry]) -> dict[str, dict[int, str]]:
    """The automatic rollbacks in force (:data:`naiad.keys.ROLLBACKS`), by model."""
    raw = await redis.hgetall(keys.ROLLBACKS)
    if not raw:
        return {}
    digests = {e.name: rollout.config_digest(e.config) for e in entries if e.config is not None}
    return rollout.parse_rollbacks(raw, digests)


async def status_snapshot(redis: Redis) -> dict[str, Any]:
    """``{"time": unix s, "models": [row, ...], "counts": {state: n}}``, models by name;
    see :func:`_model_row` for a row's keys (``None`` where a ratio or mean has no data)."""
    own = await RegistryReader(redis).read_all()
    entries = sorted(resolve_ensembles(own).values(), key=lambda e: e.name)  # as the gateways see them
    levels = {e.name: queue_policy.priority_levels(e.config) for e in entries if e.config is not None}
    tele = await telemetry.snapshot(redis, [(e.name, sorted(e.versions)) for e in entries], levels)
    streams = [keys.request_streams(e.name, levels.get(e.name, 0)) for e in entries]
    in_flight = await _in_flight(redis, streams) if entries else []
    now = time.time()
    rows = [_model_row(*parts, now) for parts in zip(entries, tele, in_flight, strict=True)]
    rolled_back = await _rollbacks(redis, entries)
    for entry, row, model in zip(entries, rows, tele, strict=True):
        row["rolled_back"] = {str(v): why for v, why in sorted(rolled_back.get(entry.name, {}).items())}
        row["version_rows"] = _version_rows(entry, model, rolled_back.get(entry.name, {}))
    counts = {state: sum(row["state"] == state for row in rows) for state in STATES}
    return {"time": now, "models": rows, "counts": counts}


# --- presentation, shared by the terminal view and the HTML page ------------------------------

COLUMNS = (
    ("model", "name"), ("state", "state"), ("versions", "versions"), ("workers", "workers"),
    ("queue", "queue"), ("in flight", "in_flight"), ("ok", "success"), ("failed", "failure"),
    ("p50", "p50_ms"), ("p99", "p99_ms"), ("cache hits", "cache_hit_ratio"),
    ("cold starts", "cold_starts"), ("avg cold start", "cold_start_avg_s"),
    ("load failures", "load_failures"), ("problem", "problem"),
)  # fmt: skip


def cell(row: dict[str, Any], key: str) -> str:
    """One value of ``row`` as text: ratios as percentages, durations with units, ``-`` for
    no data."""
    value = row[key]
    if key == "versions":
        return ",".join(value) or "-"
    if value is None or value == "":
        return "-"
    if key in ("avg_latency_ms", "p50_ms", "p99_ms"):
        return f"{value:.1f} ms"
    if key == "cold_start_avg_s":
        return f"{value:.2f} s"
    if key == "cache_hit_ratio":
        return f"{value:.0%} ({row['cache_hits']}/{row['cache_hits'] + row['cache_misses']})"
    return str(value)


#: What the columns mean where the header cannot say it.
CAPTION = (
    "queue: requests not answered yet (in flight: claimed by a worker); "
    "p50/p99: latency of successful requests at the gateway, estimated from a histogram "
    "(interpolated within its buckets, as Prometheus's histogram_quantile)"
)
STYLES = {"asleep": "dim", "waking": "yellow", "busy": "bold green", "idle": "green", "unavailable": "red"}


def has_version_view(row: dict[str, Any]) -> bool:
    """Per-version rows are drawn under a model with several versions or a split."""
    versions = row.get("version_rows", [])
    return len(versions) > 1 or any(v["weight"] is not None for v in versions)


def version_cells(version: dict[str, Any]) -> list[str]:
    """One version's row in the :data:`COLUMNS` layout: ``└ v<N>``, its state and split
    share (configured weight -> share now), requests, failures, error ratio and mean latency."""
    share = ""
    if version["weight"] is not None:
        now = f"->{version['share']}%" if version["share"] != version["weight"] else ""
        share = f" {version['weight']}%{now}"
    ratio = "-" if version["error_ratio"] is None else f"{version['error_ratio']:.1%} errors"
    latency = "-" if version["avg_latency_ms"] is None else f"{version['avg_latency_ms']:.1f} ms avg"
    by_key = {"name": f"└ v{version['version']}", "state": version["state"] + share,
              "success": str(version["success"]), "failure": str(version["failure"]),
              "p50_ms": latency, "p99_ms": ratio, "problem": version["reason"] or "-"}  # fmt: skip
    return [by_key.get(key, "") for _, key in COLUMNS]


def render_table(snapshot: dict[str, Any]) -> Any:
    """The snapshot as a ``rich`` table."""
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415

    counts = ", ".join(f"{n} {state}" for state, n in snapshot["counts"].items() if n)
    stamp = time.strftime("%H:%M:%S", time.localtime(snapshot["time"]))
    table = Table(title=f"naiad status {stamp} - {counts or 'no models'}", title_justify="left")
    for header, key in COLUMNS:
        table.add_column(header, justify="left" if key in ("name", "state", "versions") else "right")
    for row in snapshot["models"]:
        cells = [cell(row, key) for _, key in COLUMNS]
        cells[1] = Text(cells[1], style=STYLES.get(row["state"], ""))
        table.add_row(*cells)
        for version in row.get("version_rows", []) if has_version_view(row) else []:
            table.add_row(*version_cells(version), style="dim" if version["state"] != "serving" else "")
    table.caption = CAPTION
    return table


async def _watch(redis_url: str, once: bool, interval_s: float) -> int:
    from rich.console import Console  # noqa: PLC0415
    from rich.live import Live  # noqa: PLC0415

    from naiad.redis_client import connect  # noqa: PLC0415

    console = Console() if Console().is_terminal else Console(width=200)
    redis = connect(redis_url)
    try:
        if once:
            console.print(render_table(await status_snapshot(redis)))
            return 0
        with Live(render_table(await status_snapshot(redis)), console=console, auto_refresh=False) as live:
            while True:
                await asyncio.sleep(interval_s)
                live.update(render_table(await status_snapshot(redis)), refresh=True)
    finally:
        await redis.aclose()


def run_status(redis_url: str, once: bool = False, interval_s: float = 1.0) -> int:
    """``naiad status``: draw the snapshot every ``interval_s`` until Ctrl-C, or once."""
    try:
        return asyncio.run(_watch(redis_url, once, interval_s))
    except KeyboardInterrupt:
        return 0
    except RedisError as exc:
        print(f"naiad status: cannot read {redis_url}: {exc}", file=sys.stderr)
        return 1
