"""The import graph keeps its layers (pyproject.toml ``[tool.importlinter]``): the ``naiad``
kernel imports no application package, ``repository_store`` only the kernel, the gateway and
the workers never each other, and only the shell (``naiad_cli``, ``infra``) imports them all.
Function-level imports count too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 kept, 0 broken" in done.stdout, done.stdout
