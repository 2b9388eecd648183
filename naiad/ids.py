"""Identifiers a process hands out per request: unique without a system call each.

A queue id (the key a gateway's reply reader matches an answer with, :mod:`naiad.queue_client`)
and a request id for logs when the client sent none only need to differ from every other id
in flight on the same reply list or log: a random prefix drawn once per process (64 bits,
``secrets``) and a counter. ``uuid.uuid4()`` per request cost a ``getrandom`` system call and
an object each (issue 14's profile). A forked child draws a prefix of its own.
"""

from __future__ import annotations

import itertools
import os
import secrets

_PREFIX = secrets.token_hex(8)
_COUNTER = itertools.count()


def _reseed() -> None:
    global _PREFIX, _COUNTER
    _PREFIX, _COUNTER = secrets.token_hex(8), itertools.count()


os.register_at_fork(after_in_child=_reseed)


def worker_id(model: str) -> str:
    """A new worker's id (its consumer name in the model's group, its heartbeat's member):
    ``model-`` and 8 random hex digits (``secrets``): drawn once per worker, by the scaler
    that starts it or by the worker itself."""
    return f"{model}-{secrets.token_hex(4)}"


def fresh_id() -> str:
    """A new id: 16 hex digits of this process's prefix, then the counter in hex (str)."""
    return f"{_PREFIX}{next(_COUNTER):x}"
