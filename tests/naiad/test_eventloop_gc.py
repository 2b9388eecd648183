"""The collector settings every Naiad process runs with (naiad/eventloop.py)."""

import json
import subprocess
import sys

from naiad import eventloop

PROBE = """
import gc, json
from naiad import eventloop

async def main():
    return {"thresholds": gc.get_threshold(), "frozen": gc.get_freeze_count()}

print(json.dumps(eventloop.run(main())))
"""


def test_run_freezes_startup_objects_and_sets_the_thresholds():
    """A fresh interpreter: inside the loop the startup
    objects (thousands: modules, classes) sit in the permanent generation."""
    probe = [sys.executable, "-c", PROBE]
    out = subprocess.run(probe, capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(out.stdout)
    assert tuple(seen["thresholds"]) == eventloop.GC_THRESHOLDS != (700, 10, 10)
    assert seen["frozen"] > 1000
