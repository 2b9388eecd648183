"""naiad/logs.py: the request context on every record, text and JSON formats, Triton's level
flags, and the flags the scaler hands its workers."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest

from naiad import logs
from naiad.settings import Settings
from naiad_cli.commands import _settings, build_parser
from workers.scaler import LocalScaler

LOG = logging.getLogger("naiad.test_logs")
LIBRARY = logging.getLogger("somelibrary.test_logs")


@pytest.fixture
def capture():
    """``capture(**settings) -> StringIO`` with Naiad's handler writing there; restores the
    root logger's handlers and levels afterwards."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level, {p: logging.getLogger(p).level for p in logs.PACKAGES}

    def configure(**fields) -> io.StringIO:
        stream = io.StringIO()
        logs.configure(Settings(**fields), stream=stream)
        return stream

    yield configure
    root.handlers[:], root.level = saved[0], saved[1]
    for package, level in saved[2].items():
        logging.getLogger(package).setLevel(level)


def test_text_format_carries_model_version_and_request_id(capture):
    out = capture()
    with logs.request_context("req-7", "digits", 3):
        LOG.info("ran %d rows", 4)
    LOG.info("outside")
    first, second = out.getvalue().splitlines()
    assert first.endswith("INFO naiad.test_logs [digits:3 req-7]: ran 4 rows")
    assert second.endswith("INFO naiad.test_logs: outside")


def test_json_format_is_one_object_a_line_with_the_context(capture):
    out = capture(log_format="json")
    with logs.request_context("req-8", "digits", 1):
        try:
            raise ZeroDivisionError("boom")
        except ZeroDivisionError:
            LOG.exception("failed on %s", "batch")
    LOG.warning("plain")
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(records) == 2
    failed, plain = records
    assert failed["level"] == "ERROR" and failed["logger"] == "naiad.test_logs"
    assert failed["message"] == "failed on batch"
    assert (failed["model"], failed["version"], failed["request_id"]) == ("digits", "1", "req-8")
    assert "ZeroDivisionError: boom" in failed["exc_info"]
    assert "T" in failed["time"]  # ISO 8601
    assert "model" not in plain and "request_id" not in plain and "context" not in plain


def test_context_is_per_task_and_restored():
    async def one(name: str) -> list[str]:
        with logs.request_context(f"id-{name}", name, 1):
            await asyncio.sleep(0.01)
            return [logs.REQUEST_ID.get(), logs.MODEL.get()]

    async def main():
        return await asyncio.gather(one("a"), one("b"))

    assert asyncio.run(main()) == [["id-a", "a"], ["id-b", "b"]]
    assert logs.REQUEST_ID.get() == "" and logs.MODEL.get() == ""


def test_batch_ids_are_capped():
    assert logs.batch_ids(["a", "b"]) == "a,b"
    ids = [str(i) for i in range(logs.MAX_IDS + 3)]
    assert logs.batch_ids(ids).endswith(f"{logs.MAX_IDS - 1},+3")


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, {"INFO", "WARNING", "ERROR", "CRITICAL"}),
        ({"log_info": False}, {"WARNING", "ERROR", "CRITICAL"}),
        ({"log_warning": False}, {"INFO", "ERROR", "CRITICAL"}),  # Triton's switches are independent
        ({"log_error": False}, {"INFO", "WARNING"}),
        ({"log_verbose": 1}, {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}),
        ({"log_level": "WARNING"}, {"WARNING", "ERROR", "CRITICAL"}),
        ({"log_level": "ERROR", "log_verbose": 1}, {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}),
    ],
)
def test_triton_level_flags(capture, fields, expected):
    out = capture(**fields)
    for level in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        LOG.log(logging.getLevelName(level), "at %s", level)
    assert {line.split()[2] for line in out.getvalue().splitlines()} == expected


def test_verbose_2_turns_libraries_to_debug_too(capture):
    out = capture(log_verbose=1)
    LIBRARY.debug("quiet")
    assert "quiet" not in out.getvalue()
    out = capture(log_verbose=2)
    LIBRARY.debug("loud")
    assert "loud" in out.getvalue()


def test_unknown_level_is_refused(capture):
    with pytest.raises(ValueError, match="unknown log level"):
        capture(log_level="LOUD")


def test_configure_twice_keeps_one_handler(capture):
    capture()
    capture(log_format="json")
    ours = [h for h in logging.getLogger().handlers if h.get_name() == "naiad"]
    assert len(ours) == 1


def test_cli_flags_reach_settings_and_the_workers_command():
    args = build_parser().parse_args([
        "serve", "--log-format", "json", "--log-verbose", "1", "--log-info", "false",
        "--log-warning", "true", "--log-error", "0", "--trace",
    ])  # fmt: skip
    settings = _settings(args)
    assert (settings.log_format, settings.log_verbose, settings.log_info) == ("json", 1, False)
    assert (settings.log_warning, settings.log_error, settings.trace) == (True, False, True)
    command = LocalScaler(settings, "redis://127.0.0.1:1").worker_command("digits")
    flags = dict(zip(command, command[1:], strict=False))
    assert flags["--log-format"] == "json" and flags["--log-verbose"] == "1"
    assert (flags["--log-info"], flags["--log-warning"], flags["--log-error"]) == ("false", "true", "false")
    assert "--trace" in command
    reparsed = _settings(build_parser().parse_args(command[3:]))  # what the worker will see
    assert reparsed.log_format == "json" and reparsed.log_info is False and reparsed.trace


def test_bad_boolean_flag_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--log-info", "maybe"])
    assert "expected true or false" in capsys.readouterr().err
