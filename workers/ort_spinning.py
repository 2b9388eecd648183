"""ONNX Runtime sessions built without a word on spinning do not spin in a worker.

ONNX Runtime's intra-op pool spins by default after every parallel run, waiting for the next
one without sleeping (``session.intra_op.allow_spinning`` 1,
https://onnxruntime.ai/docs/performance/tune-performance/threading.html): the benchmark's
``model.py`` pool thread spins 20–40 ms after each run from 16 rows up
(``bench/results/ort_spinning_rows.md``), so under load it never sleeps, and after a lone
request it burns those milliseconds of CPU a serverless user pays for. Naiad's own ONNX
backend turns spinning off (:mod:`workers.backends.onnxruntime`); a Python-backend
``model.py`` builds its sessions itself, so :func:`install` makes the same the default there:
every session built through ``onnxruntime.InferenceSession(...)`` in the worker process whose
options do not set :data:`SPINNING` (no options at all, or options without that key) is
created with it set to :data:`SPINNING_DEFAULT`. A session whose options set it, "1" included,
is left as asked; the model's file is not changed, only ONNX Runtime's default in this process.
The options object a model passes gets the key added (ONNX Runtime cannot copy options): it
reads back "0", and setting "1" on it afterwards overwrites it (with ONNX Runtime's warning).
Anything passed as options that is not a ``SessionOptions`` goes to ONNX Runtime untouched.
Sessions built otherwise (``C.InferenceSession`` directly, a model package's own factory) keep
ONNX Runtime's default; the spin watch still demotes their spinners. ``--onnxruntime-spinning
true`` (:attr:`naiad.settings.Settings.onnxruntime_spinning`) keeps ONNX Runtime's own default.

The spin watch (:mod:`workers.spin_watch`) still finds and demotes other frameworks'
spinners; with an ONNX Runtime pool spinning at ``SCHED_IDLE`` the benchmark's
``digits_python`` ran at c32 1.10× (JSON) to 1.17× (gRPC) slower than without, its worker at
twice the CPU a request (docs/benchmarks.md, "Stop 45").

Where ONNX Runtime is imported when :func:`install` runs (a warm-pool process imports its
framework before its claim), its class is patched at once; an import hook on ``sys.meta_path``
for the module that defines ``InferenceSession`` patches it whenever that module is executed
later (a first import, or a fresh copy), so a ``model.py`` that imports ONNX Runtime at its
top, in ``initialize`` or later is covered alike. The hook wraps the module's own loader and
passes on whatever else is asked of it (``get_source``, ``get_code``...).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)

#: ONNX Runtime's session config key for spinning idle intra-op threads, and Naiad's default.
SPINNING = "session.intra_op.allow_spinning"
SPINNING_DEFAULT = "0"
#: The module that defines ``InferenceSession`` (onnxruntime 1.x's layout).
SESSION_MODULE = "onnxruntime.capi.onnxruntime_inference_collection"
_PATCHED = "_naiad_spinning_default"


def sets_spinning(options: Any) -> bool:
    """Whether ONNX Runtime ``SessionOptions`` ``options`` set :data:`SPINNING` (its
    ``get_session_config_entry`` raises ``RuntimeError`` for a key never set)."""
    try:
        options.get_session_config_entry(SPINNING)
    except RuntimeError:
        return False
    return True


def patch(module: ModuleType) -> None:
    """Make ``module.InferenceSession`` (``module``: :data:`SESSION_MODULE`) default
    :data:`SPINNING` to :data:`SPINNING_DEFAULT` for options that do not set it (once)."""
    session = getattr(module, "InferenceSession", None)
    options_type = getattr(module, "C", None) and getattr(module.C, "SessionOptions", None)
    if session is None or options_type is None or getattr(session.__init__, _PATCHED, False):
        return
    original = session.__init__

    @functools.wraps(original)
    def __init__(self: Any, path_or_bytes: Any, sess_options: Any = None, *args: Any, **kwargs: Any) -> None:
        if sess_options is None:
            sess_options = options_type()
        if isinstance(sess_options, options_type) and not sets_spinning(sess_options):
            sess_options.add_session_config_entry(SPINNING, SPINNING_DEFAULT)
        original(self, path_or_bytes, sess_options, *args, **kwargs)  # anything else: ORT's to judge

    setattr(__init__, _PATCHED, True)
    session.__init__ = __init__
    logger.debug("ONNX Runtime sessions built here default to %s=%s", SPINNING, SPINNING_DEFAULT)


class _PatchingLoader(importlib.abc.Loader):
    """:data:`SESSION_MODULE`'s own loader (``inner``), patching the module once executed;
    anything else asked of it (``get_source``, ``get_code``, ``get_resource_reader``...) is
    ``inner``'s, since it is the module's ``__loader__``."""

    def __init__(self, inner: Any):
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        patch(module)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds :data:`SESSION_MODULE` as the path finder does, its loader wrapped to patch it."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname != SESSION_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader)
        return spec


_HOOK = _PatchOnImport()


def install() -> None:
    """Default ONNX Runtime sessions of this process to no spinning (module doc): patched now
    when :data:`SESSION_MODULE` is imported, and by the import hook whenever it is executed
    later (idempotent)."""
    loaded = sys.modules.get(SESSION_MODULE)
    if loaded is not None:
        patch(loaded)
    if _HOOK not in sys.meta_path:  # also for a later import of a fresh copy (reload, re-import)
        sys.meta_path.insert(0, _HOOK)
