"""An explicit model load tries the model in a child process before it answers.

Triton's load_model returns once the model is loaded, or fails at once with the load error
(model_management.md, "Model Control Mode EXPLICIT"; the model is then UNAVAILABLE). The
registry entry only says that the config and files are present; whether the backend accepts
the files shows when it loads them. So :meth:`gateway.registry.ModelRegistry.load` hands
each READY, non-ensemble entry it is about to publish to a :class:`LoadProbe`, which runs
``python -m workers.load_check`` (:func:`workers.load_check.main`) as an asyncio subprocess:
the gateway never imports a framework, its event loop keeps serving meanwhile (a
TensorFlow SavedModel takes seconds), and a framework that crashes takes only the child
down. The child pulls into this machine's model cache, where workers find the version.

Outcomes: loaded (None), or a reason the load failed in the model (a corrupt file, a Python
model whose ``initialize`` raises, a failing warmup sample, a crash, no answer within
``timeout_s``): the registry marks the model UNAVAILABLE with it and the load request fails
(400 / INVALID_ARGUMENT). A failure outside the model (the repository unreachable during the
pull) raises :class:`RepositoryError` (503) and changes nothing. Where the backend's
framework is not installed (a gateway-only image: workers run elsewhere) the check is
skipped with a log line, and a worker's load failure marks the model later
(:mod:`workers.load_failure`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from naiad.errors import RepositoryError
from naiad.registry import ModelEntry

logger = logging.getLogger(__name__)

#: Seconds a load check may take before it is killed and the load fails.
LOAD_CHECK_TIMEOUT_S = 300.0
#: The load check's command (:func:`workers.load_check.main`).
LOAD_CHECK_COMMAND = (sys.executable, "-m", "workers.load_check")


@dataclass(frozen=True)
class LoadProbe:
    """Loads models in a child process: ``repository`` (URI), ``cache_dir`` and
    ``cache_max_bytes`` as the workers of this machine use them."""

    repository: str
    cache_dir: Path
    cache_max_bytes: int
    timeout_s: float = LOAD_CHECK_TIMEOUT_S
    command: tuple[str, ...] = LOAD_CHECK_COMMAND

    async def __call__(self, entry: ModelEntry) -> str | None:
        """None when every version of ``entry`` loaded (or the check was skipped), else
        the load error. Raises :class:`RepositoryError` for a failure outside the model."""
        answer, stderr, code = await self._run(entry)
        if answer is None:
            last = stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
            how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
            return f"failed to load model '{entry.name}': the load crashed ({how}) {last[0]}".strip()
        if "skipped" in answer:
            logger.warning("load check of model '%s' skipped: %s", entry.name, answer["skipped"])
            return None
        if "error" not in answer:
            return None
        if not answer.get("fault", True):
            raise RepositoryError(answer["error"])
        return str(answer["error"])

    async def _run(self, entry: ModelEntry) -> tuple[dict | None, bytes, int]:
        """The child's answer (None when it gave none), its stderr and exit status. A child
        gone before its request could be written (its stdin closed: seen under load with
        gRPC's threads running while the gateway forks) says nothing about the model: a
        second child is tried, and a second such loss is reported as a crash."""
        request = json.dumps({
            "entry": base64.b64encode(entry.to_bytes()).decode(), "repository": self.repository,
            "cache_dir": str(self.cache_dir), "cache_max_bytes": self.cache_max_bytes,
        }).encode()  # fmt: skip
        try:
            return await self._run_once(entry, request)
        except _ChildLost as lost:
            logger.warning("load check of model '%s': %s; trying a new child", entry.name, lost)
        try:
            return await self._run_once(entry, request)
        except _ChildLost as lost:
            return None, str(lost).encode(), lost.code

    async def _run_once(self, entry: ModelEntry, request: bytes) -> tuple[dict | None, bytes, int]:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "-1"}  # on the CPU: leave the GPUs to workers
        child = await asyncio.create_subprocess_exec(
            *self.command, env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(child.communicate(request), self.timeout_s)
        except TimeoutError:
            return {"error": f"failed to load model '{entry.name}': the load did not finish within "
                             f"{self.timeout_s:g} s", "fault": True}, b"", -9  # fmt: skip
        except (BrokenPipeError, ConnectionResetError, RuntimeError) as exc:  # uvloop: "handler is closed"
            code = await child.wait()
            raise _ChildLost(f"the child exited before reading its request ({exc})", code) from None
        finally:
            if child.returncode is None:  # timed out, or the caller was cancelled
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
                await child.wait()
        lines = out.decode(errors="replace").strip().splitlines()
        try:
            answer = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            answer = None
        return answer if isinstance(answer, dict) else None, err, child.returncode or 0


class _ChildLost(Exception):
    """A load-check child that closed its stdin before its request was written."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code
