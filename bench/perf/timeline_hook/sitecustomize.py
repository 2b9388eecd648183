"""Marks for :mod:`bench.perf.timeline`, and call counts for :mod:`bench.perf.calls`, in
every Naiad process of such a run.

This folder goes first on ``PYTHONPATH`` of the ``naiad serve`` that :mod:`bench.perf.timeline`
starts (its workers inherit it), so Python imports this module at start-up (``site``:
``sitecustomize``). With ``NAIAD_TIMELINE_DIR`` set it starts a daemon thread that wraps
each function named in ``NAIAD_TIMELINE_TARGETS`` (``module:Qualified.name``, comma-separated)
as soon as its module is imported (every 20 ms it looks; early, because an event loop's
transport keeps the ``data_received`` of its protocol from the connection's start), so that
each call, once the file ``on`` is there, appends ``("Name<", ns)`` and ``("Name>", ns)``
(``time.perf_counter_ns``: ``CLOCK_MONOTONIC``, one clock for every process of the machine);
at the file ``off`` it writes the marks to ``marks-PID.json`` (whole: a temporary file
renamed) and stops. Without the variable it does nothing. Being first on the path, it stands
in for any ``sitecustomize`` of the system (Debian's, for apport) in those processes.

With ``NAIAD_CALLS_DIR`` set instead, the process runs under :mod:`cProfile` (its main
thread: the event loop's) from start-up; at the file ``on`` in that folder it takes the call
counts and times so far (and says so: a file ``counting-PID``), at ``off`` again, and writes
the difference by function with its ``argv`` to ``calls-PID.json``: ``calls``, ``self_s`` and
``inclusive_s`` (cProfile's ``inlinetime`` and ``totaltime``, seconds).
"""

import os

if os.environ.get("NAIAD_TIMELINE_DIR"):
    import inspect
    import json
    import sys
    import threading
    import time

    _folder = os.environ["NAIAD_TIMELINE_DIR"]
    _marks: list[tuple[str, int]] = []
    _on = [False]

    def _wrap(owner, name: str, tag: str) -> None:
        original, clock = getattr(owner, name), time.perf_counter_ns
        if inspect.iscoroutinefunction(original):

            async def wrapped(*args, **kwargs):
                if _on[0]:
                    _marks.append((tag + "<", clock()))
                try:
                    return await original(*args, **kwargs)
                finally:
                    if _on[0]:
                        _marks.append((tag + ">", clock()))
        else:

            def wrapped(*args, **kwargs):
                if _on[0]:
                    _marks.append((tag + "<", clock()))
                try:
                    return original(*args, **kwargs)
                finally:
                    if _on[0]:
                        _marks.append((tag + ">", clock()))

        setattr(owner, name, wrapped)

    def _patch(pending: set[str]) -> None:
        for spec in list(pending):
            module_name, _, qualified = spec.partition(":")
            owner = sys.modules.get(module_name)
            if owner is None:
                continue
            *path, name = qualified.split(".")
            try:
                for part in path:
                    owner = getattr(owner, part)
                _wrap(owner, name, ".".join(qualified.split(".")[-2:]))
            except AttributeError:  # not yet defined (a module being imported): next look
                continue
            pending.discard(spec)

    def _watch() -> None:
        pending = set(filter(None, os.environ.get("NAIAD_TIMELINE_TARGETS", "").split(",")))
        while not os.path.exists(os.path.join(_folder, "off")):
            if pending:
                _patch(pending)
            _on[0] = _on[0] or os.path.exists(os.path.join(_folder, "on"))
            time.sleep(0.02)
        _on[0] = False
        path = os.path.join(_folder, f"marks-{os.getpid()}.json")
        with open(path + ".part", "w") as out:
            json.dump(_marks, out)
        os.replace(path + ".part", path)

    threading.Thread(target=_watch, daemon=True, name="naiad-timeline").start()

if os.environ.get("NAIAD_CALLS_DIR"):  # bench.perf.calls: this process's function calls, counted
    import cProfile
    import json
    import sys
    import threading
    import time

    _calls_folder = os.environ["NAIAD_CALLS_DIR"]
    _profile = cProfile.Profile()
    _profile.enable()  # this thread's calls only: the main thread, where the event loop runs

    def _counts() -> dict[str, list[float]]:
        """Per function so far, ``[calls, self seconds, inclusive seconds]`` (cProfile's
        ``callcount``, ``inlinetime``, ``totaltime``), keyed ``file:line:name`` (a builtin:
        its ``<...>`` text)."""
        counts: dict[str, list[float]] = {}
        for entry in _profile.getstats():
            code = entry.code
            if not isinstance(code, str):
                code = f"{code.co_filename}:{code.co_firstlineno}:{code.co_name}"
            row = counts.setdefault(code, [0, 0.0, 0.0])
            row[0] += entry.callcount
            row[1] += entry.inlinetime
            row[2] += entry.totaltime
        return counts

    def _count() -> None:
        on, off = (os.path.join(_calls_folder, name) for name in ("on", "off"))
        while not os.path.exists(on):
            time.sleep(0.02)
        before = _counts()
        open(os.path.join(_calls_folder, f"counting-{os.getpid()}"), "w").close()
        while not os.path.exists(off):
            time.sleep(0.02)
        after = _counts()
        zero = [0, 0.0, 0.0]
        spent = {
            key: [a - b for a, b in zip(row, before.get(key, zero), strict=True)]
            for key, row in after.items()
        }
        spent = {key: row for key, row in spent.items() if row[0] > 0}
        path = os.path.join(_calls_folder, f"calls-{os.getpid()}.json")
        with open(path + ".part", "w") as out:
            json.dump(
                {
                    "argv": sys.argv,
                    "calls": {key: row[0] for key, row in spent.items()},
                    "self_s": {key: row[1] for key, row in spent.items()},
                    "inclusive_s": {key: row[2] for key, row in spent.items()},
                },
                out,
            )
        os.replace(path + ".part", path)

    threading.Thread(target=_count, daemon=True, name="naiad-calls").start()
