"""The repository index: every model's config, served versions and readiness.

A model is READY when its config parses and validates, its version policy selects at least
one version, and each selected version folder holds the backend's model file (Triton's
readiness rules, model_repository.md and model_management.md). Anything else makes that one
model UNAVAILABLE with a reason; it never affects the other models.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from naiad.errors import ConfigError, ModelNotFound
from naiad.registry import READY, UNAVAILABLE, ModelEntry
from repository_store.autocomplete import autocomplete, needs_autocomplete
from repository_store.config import (
    ModelConfig,
    backend_of,
    default_model_filename,
    parse_config,
    select_versions,
    validate_config,
)
from repository_store.ensemble import dependency_reason, is_ensemble
from repository_store.python_autocomplete import autocomplete_python, is_python_model
from repository_store.store import FileInfo, RepositoryStore, validate_model_name
from repository_store.warmup import file_problem, uses_files

#: Largest ``config.pbtxt`` indexed (a real one is a few KiB; Triton sets no limit): a
#: bigger one makes its model UNAVAILABLE instead of stalling every gateway's index.
MAX_CONFIG_BYTES = 1024 * 1024

#: How the ``reason`` of a model whose last change failed, while it keeps serving, begins.
RELOAD_FAILED = "reload failed"


def index_model(store: RepositoryStore, name: str, config: ModelConfig | None = None) -> ModelEntry:
    """Index one model; ``config`` (already parsed) replaces its ``config.pbtxt`` when given
    (Triton's load request with a ``config`` parameter).

    :raises ModelNotFound: invalid name, or no folder ``name`` in the repository.
    :raises RepositoryError: the store itself cannot be read. A broken model is never an
        exception: it comes back UNAVAILABLE with the reason.
    """
    validate_model_name(name)
    if not store.model_exists(name):
        raise ModelNotFound(f"model '{name}' is not in the repository {store.uri}")
    return _index(store, name, config)


def index_repository(store: RepositoryStore) -> dict[str, ModelEntry]:
    """Index every model of the repository, by name (sorted).

    :raises RepositoryError: the store cannot be read.
    """
    return {name: _index(store, name) for name in store.list_models()}


def index_models(store: RepositoryStore, names: list[str]) -> dict[str, ModelEntry]:
    """Index the models ``names`` only (a poll's changed models), by name. A name whose
    folder has just gone comes back UNAVAILABLE, never as an exception.

    :raises RepositoryError: the store cannot be read.
    """
    return {name: _index(store, name) for name in sorted(names)}


def resolve_ensembles(entries: Mapping[str, ModelEntry]) -> dict[str, ModelEntry]:
    """``entries`` with every READY ensemble that cannot run with the models around it
    (a composing model missing or not ready, a version not served, maps or tensors that do
    not fit, a circular dependency: :func:`repository_store.ensemble.dependency_reason`)
    turned UNAVAILABLE with the reason. Triton: an ensemble is ready only when its composing
    models are. The index itself stays per model; the registry applies this to what it holds.
    """
    resolved = dict(entries)
    for name, entry in entries.items():
        if entry.ready and is_ensemble(entry.config):
            reason = dependency_reason(name, entries)
            if reason:
                resolved[name] = replace(entry, state=UNAVAILABLE, reason=reason)
    return resolved


def keep_last_good(previous: ModelEntry | None, candidate: ModelEntry) -> ModelEntry:
    """What to publish when ``candidate`` (just indexed, and load-checked where a check
    runs) would replace ``previous`` (what serves now; None: nothing).

    Triton: "if the reload fails for any reason the already loaded model will be unchanged
    and will remain loaded" (model_management.md). A change fails when the candidate cannot
    serve or any of its versions failed; then ``previous``, if it serves, stays as it was,
    its ``reason`` saying what failed, and ``failed`` the candidate's failed versions it does
    not serve itself. Otherwise (a clean change, or nothing serving) the candidate.
    """
    if previous is None or not previous.ready or previous.config is None or not candidate.problem:
        return candidate
    served = ", ".join(map(str, previous.versions))
    failed = previous.failed
    if candidate.config is not None:
        failed = {v: why for v, why in candidate.failed.items() if v not in previous.versions}
        if not candidate.ready:
            failed.update({v: candidate.reason for v in candidate.versions if v not in previous.versions})
    reason = f"{RELOAD_FAILED} (still serving version {served}): {candidate.problem}"
    return replace(previous, reason=reason, failed=failed)


def _index(store: RepositoryStore, name: str, override: ModelConfig | None = None) -> ModelEntry:
    try:
        available = store.list_versions(name)
        config = _config(store, name, available, override)
    except ConfigError as exc:  # also UnsafeModelFile: a symlink or key leading out
        return ModelEntry(name, None, reason=exc.message)
    selected = select_versions(config, available)
    entry = ModelEntry(name, config, selected)
    if not selected:
        entry.reason = "no version available under the version policy"
        return entry
    try:
        entry.failed = missing_model_files(store, config, selected)
        entry.versions = [v for v in selected if v not in entry.failed]
        if not entry.versions:
            entry.reason = entry.failed[max(entry.failed)]
        if not entry.reason:
            entry.labels, entry.reason = _labels(store, config)
        if not entry.reason and uses_files(config):  # model_warmup's input_data_file
            entry.reason = file_problem(config, {f.path: f.size for f in store.list_model_files(name)})
    except ConfigError as exc:
        entry.reason = exc.message
    entry.state = UNAVAILABLE if entry.reason else READY
    return entry


def _labels(store: RepositoryStore, config: ModelConfig) -> tuple[dict[str, list[str]], str]:
    """Each output's label file, one label per line (Triton's classification extension
    reads ``label_filename`` from the model folder); a missing file makes the model
    unavailable, as it fails Triton's load."""
    labels: dict[str, list[str]] = {}
    for output in config.output:
        if not output.label_filename:
            continue
        text = store.read_model_file(config.name, output.label_filename)
        if text is None:
            return {}, f"label file '{output.label_filename}' of output '{output.name}' is missing"
        labels[output.name] = text.decode(errors="replace").splitlines()
    return labels, ""


def _config(
    store: RepositoryStore, name: str, available: list[int], override: ModelConfig | None = None
) -> ModelConfig:
    """The model's validated config (``override`` instead of ``config.pbtxt`` when given),
    auto-completed from its ONNX file where it is missing or partial (Triton's default
    auto-complete), or by a Python model's ``auto_complete_config``. Raises :class:`ConfigError`."""
    if override is not None:
        text, config = b"", override
    else:
        text = store.read_config(name)
        if text is not None and len(text) > MAX_CONFIG_BYTES:
            raise ConfigError(f"config.pbtxt is {len(text)} bytes, over the {MAX_CONFIG_BYTES}-byte limit")
        config = parse_config(text, name) if text is not None else ModelConfig(name=name)
    if is_python_model(config):  # Triton calls a Python model's own auto_complete_config
        config = autocomplete_python(store, config, select_versions(config, available) or available)
    elif needs_autocomplete(config):
        try:
            config = autocomplete(store, config, select_versions(config, available) or available)
        except ConfigError as exc:
            missing = "missing config.pbtxt, and " if text is None else ""
            raise ConfigError(f"{missing}the config cannot be auto-completed: {exc.message}") from None
    validate_config(config)
    return config


def missing_model_files(store: RepositoryStore, config: ModelConfig, versions: list[int]) -> dict[int, str]:
    """The ``versions`` whose folder lacks the backend's model file, with the reason (each
    version on its own: Triton loads the others)."""
    if backend_of(config) == "ensemble":
        return {}
    filename = default_model_filename(config)
    missing = {}
    for version in versions:
        if not _holds(store.list_version_files(config.name, version), filename):
            missing[version] = f"version {version} has no '{filename}'"
    return missing


def _holds(files: list[FileInfo], filename: str) -> bool:
    """A file named ``filename``, or a folder of that name (``model.savedmodel/``, or an
    ONNX model with external data in ``model.onnx/``)."""
    return any(f.path == filename or f.path.startswith(filename + "/") for f in files)
