"""Complete a Python-backend model's config with its ``auto_complete_config``.

Triton calls the model class's static ``auto_complete_config(auto_complete_model_config)``
when it loads the model (python_backend README, "auto_complete_config"), in a throw-away
stub process, and serves the ``pb_utils.ModelConfig`` it returns. Naiad does the same when
it indexes the repository, so a minimal config (``backend: "python"`` and little else) is
complete before any request is validated against it, with zero workers running.

The user's code never runs in the indexing process (a gateway must not import what a
``model.py`` imports: torch, tensorflow...). ``model.py`` is first read with :mod:`ast`;
only when its ``TritonPythonModel`` defines ``auto_complete_config`` are the version's
Python files fetched into a temporary folder and the method run in a child process
(``python -m workers.backends.python auto-complete``), bounded by
:data:`AUTOCOMPLETE_TIMEOUT_S`. Its failure makes the model UNAVAILABLE with the message.
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys
import tempfile

from naiad.errors import ConfigError, RepositoryError
from repository_store.config import (
    ModelConfig,
    config_to_triton_json,
    default_model_filename,
    parse_config_json,
)
from repository_store.store import RepositoryStore

#: Longest time one ``auto_complete_config`` may take, imports included (seconds).
AUTOCOMPLETE_TIMEOUT_S = 60.0
#: Most bytes of ``.py`` files fetched from a version folder to run it.
MAX_SOURCE_BYTES = 16 * 1024 * 1024
#: The child process's entry point (:func:`workers.backends.python.auto_complete_main`).
CHILD_MODULE = "workers.backends.python"


def is_python_model(config: ModelConfig) -> bool:
    return config.backend == "python"


def defines_auto_complete(source: bytes) -> bool:
    """True when ``source`` (a ``model.py``) has a class ``TritonPythonModel`` with an
    ``auto_complete_config`` method. The file is parsed, never run; a file that does not
    parse is False (its load reports the error)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return any(
        isinstance(node, ast.ClassDef) and node.name == "TritonPythonModel"
        and any(isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                and item.name == "auto_complete_config" for item in node.body)
        for node in tree.body
    )  # fmt: skip


def autocomplete_python(store: RepositoryStore, config: ModelConfig, versions: list[int]) -> ModelConfig:
    """``config`` completed by the ``auto_complete_config`` of the newest of ``versions``
    (``config`` itself when there is no version, no model file, or no such method).

    :raises ConfigError: the method raised, returned something else than the config
        object, timed out, or completed a config that does not parse.
    """
    if not versions:
        return config
    version, filename = max(versions), default_model_filename(config)
    with tempfile.TemporaryDirectory(prefix="naiad-autocomplete-") as folder:
        path = pathlib.Path(folder) / filename
        try:
            store.fetch_file(config.name, version, filename, path)
        except (OSError, RepositoryError):
            return config  # the index reports the missing model file
        if not defines_auto_complete(path.read_bytes()):
            return config
        _fetch_sources(store, config.name, version, pathlib.Path(folder), filename)
        return _run_child(config, path)


def _fetch_sources(store: RepositoryStore, model: str, version: int, folder: pathlib.Path, skip: str) -> None:
    """The version's other ``.py`` files (``model.py`` may import them), up to
    :data:`MAX_SOURCE_BYTES`."""
    total = 0
    for info in store.list_version_files(model, version):
        if not info.path.endswith(".py") or info.path == skip:
            continue
        total += info.size
        if total > MAX_SOURCE_BYTES:
            raise ConfigError(f"model '{model}': the Python files of version {version} exceed "
                              f"{MAX_SOURCE_BYTES} bytes")  # fmt: skip
        store.fetch_file(model, version, info.path, folder / info.path)


def _run_child(config: ModelConfig, path: pathlib.Path) -> ModelConfig:
    out = path.parent / ".naiad-autocomplete.json"
    command = [sys.executable, "-m", CHILD_MODULE, "auto-complete", str(path), str(out)]
    what = f"auto_complete_config of model '{config.name}'"
    try:
        done = subprocess.run(
            command, input=json.dumps(config_to_triton_json(config)), capture_output=True, text=True,
            timeout=AUTOCOMPLETE_TIMEOUT_S, cwd=path.parent, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{what} took longer than {AUTOCOMPLETE_TIMEOUT_S:g} s") from None
    if done.returncode != 0 or not out.exists():
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise ConfigError(f"{what} failed: {lines[-1] if lines else f'exit code {done.returncode}'}")
    return parse_config_json(out.read_text(), config.name)
