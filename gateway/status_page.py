"""The read-only status page at ``GET /`` of the HTTP port: :func:`gateway.status.status_snapshot`
as a small server-rendered HTML table (no JavaScript; the browser reloads it every
:data:`REFRESH_S` seconds). Every value is HTML-escaped: model names, reasons and versions
come from the repository, which the page's reader does not control.
"""

from __future__ import annotations

import time
from html import escape
from typing import Any

from gateway.status import BUSY_WINDOW_S, CAPTION, COLUMNS, STATES, cell, has_version_view, version_cells
from naiad import __version__

REFRESH_S = 2

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #1d2433; background: #fafbfc; }
h1 { font-size: 1.4rem; margin: 0 0 .2rem; } .sub { color: #667; margin-bottom: 1rem; }
.counts span { display: inline-block; margin-right: .5rem; padding: .15rem .6rem;
  border-radius: 1rem; font-size: .85rem; }
table { border-collapse: collapse; width: 100%; background: #fff; margin-top: 1rem;
  box-shadow: 0 1px 3px rgba(0,0,0,.08); }
th, td { padding: .4rem .55rem; border-bottom: 1px solid #e6e8eb; text-align: right;
  font-variant-numeric: tabular-nums; white-space: nowrap; font-size: .92rem; }
th { background: #f0f2f5; font-size: .72rem; text-transform: uppercase; color: #556;
  white-space: normal; vertical-align: bottom; }
th.l, td.l { text-align: left; } td.reason { color: #a33; font-size: .85rem; white-space: normal; }
.state { padding: .1rem .55rem; border-radius: 1rem; font-size: .85rem; font-weight: 600; }
.asleep { background: #eceff3; color: #5b6573; } .waking { background: #fff1c2; color: #7a5800; }
.busy { background: #c9f2d4; color: #0c6b2c; } .idle { background: #e3f6e8; color: #2f7a45; }
.unavailable { background: #fde0e0; color: #9b1c1c; }
p.note { color: #667; font-size: .85rem; }
"""

LEFT = {"name", "state", "versions"}


def _row(row: dict[str, Any]) -> str:
    cells = []
    for _, key in COLUMNS:
        text = escape(cell(row, key))
        if key == "state":
            text = f'<span class="state {escape(row["state"])}">{text}</span>'
        cells.append(f'<td class="{"l" if key in LEFT else "r"}">{text}</td>')
    html = f'<tr data-model="{escape(row["name"])}" data-state="{escape(row["state"])}">{"".join(cells)}</tr>'
    if row["state"] == "unavailable" and row["reason"]:
        span = len(COLUMNS) - 1
        html += f'<tr><td></td><td class="l reason" colspan="{span}">{escape(row["reason"])}</td></tr>'
    for version in row.get("version_rows", []) if has_version_view(row) else []:
        texts = zip(COLUMNS, version_cells(version), strict=True)
        cells = "".join(f'<td class="{"l" if key in LEFT else "r"}">{escape(text)}</td>'
                        for (_, key), text in texts)  # fmt: skip
        html += f'<tr class="version">{cells}</tr>'
    return html


def render_page(snapshot: dict[str, Any]) -> str:
    """The whole HTML document for ``snapshot`` (see :func:`gateway.status.status_snapshot`)."""
    counts = "".join(
        f'<span class="{state}">{snapshot["counts"][state]} {state}</span>'
        for state in STATES if snapshot["counts"].get(state)
    )  # fmt: skip
    headers = "".join(f'<th class="{"l" if key in LEFT else "r"}">{escape(h)}</th>' for h, key in COLUMNS)
    rows = "".join(_row(row) for row in snapshot["models"]) or (
        f'<tr><td class="l" colspan="{len(COLUMNS)}">no models in the registry</td></tr>'
    )
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snapshot["time"]))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{REFRESH_S}">
<title>Naiad status</title><style>{STYLE}</style></head>
<body>
<h1>Naiad</h1>
<div class="sub">inference gateway {escape(__version__)} &middot; {escape(stamp)} &middot;
refreshes every {REFRESH_S} s &middot; <a href="/v2/openapi.json">API</a></div>
<div class="counts">{counts}</div>
<table><thead><tr>{headers}</tr></thead><tbody>{rows}</tbody></table>
<p class="note">{escape(CAPTION)}. Asleep: no worker, nothing queued (scaled to zero).
Waking: requests queued, no worker yet (a cold start). Busy: workers up, requests queued or
answered in the last {BUSY_WINDOW_S:g} s. Idle: workers up, nothing to do.</p>
</body></html>
"""
