"""``naiad <command> --help`` shows every flag's default, and that default is the one the
command really runs with (the ``Settings`` field, parsed from an empty command line)."""

from __future__ import annotations

import os
import re

import pytest

from naiad_cli.commands import COMMON_FLAGS, GATEWAY_FLAGS, POOL_FLAGS, SCALER_FLAGS, _settings, build_parser


@pytest.fixture(autouse=True)
def no_naiad_environment(monkeypatch):
    """``NAIAD_*`` variables override the defaults the help shows: none for these tests."""
    for name in [n for n in os.environ if n.startswith("NAIAD_")]:
        monkeypatch.delenv(name)


def help_text(capsys, *command: str) -> str:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([*command, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def flag_help(text: str, flag: str) -> str:
    """The help of ``flag`` in ``--help`` output, on one line (argparse wraps it)."""
    options = text.split("options:", 1)[1]
    match = re.search(rf"^  {re.escape(flag)}\b(.*?)(?=^  -|\Z)", options, re.MULTILINE | re.DOTALL)
    assert match, f"{flag} not in the help"
    return " ".join(match.group(1).split())


def shown(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


@pytest.mark.parametrize("flag", ["--idle-timeout", "--request-timeout", "--http-port", "--max-workers"])
def test_serve_help_shows_the_default_serve_runs_with(capsys, flag):
    dest = (COMMON_FLAGS | GATEWAY_FLAGS | SCALER_FLAGS)[flag][0]
    running = getattr(_settings(build_parser().parse_args(["serve"])), dest)
    assert f"(default: {shown(running)})" in flag_help(help_text(capsys, "serve"), flag)


def test_every_flag_with_a_default_shows_it_once(capsys):
    """A default written by hand in a help text would be a second place that can go stale."""
    flags = COMMON_FLAGS | GATEWAY_FLAGS | SCALER_FLAGS | POOL_FLAGS
    text = help_text(capsys, "serve")
    settings = _settings(build_parser().parse_args(["serve"]))
    for flag, (dest, _, _) in flags.items():
        described = flag_help(text, flag)
        assert described.count("(default") <= 1, described
        value = getattr(settings, dest, None)
        if value not in (None, []):
            assert f"(default: {shown(value)})" in described, (flag, described)


def test_worker_help_shows_the_idle_timeout(capsys):
    settings = _settings(build_parser().parse_args(["worker", "--model", "m"]))
    described = flag_help(help_text(capsys, "worker"), "--idle-timeout")
    assert f"(default: {shown(settings.idle_timeout_s)})" in described


def test_tool_defaults_are_shown(capsys):
    args = build_parser().parse_args(["status", "--redis-url", "redis://x"])
    assert f"(default: {shown(args.interval)})" in flag_help(help_text(capsys, "status"), "--interval")
    args = build_parser().parse_args(["k8s", "render", "--out", "x"])
    render = help_text(capsys, "k8s", "render")
    for flag, value in (("--namespace", args.namespace), ("--image-worker", args.image_worker)):
        assert f"(default: {value})" in flag_help(render, flag)
