"""gateway.access: flag parsing, the route/RPC -> API group tables, constant-time checks."""

from __future__ import annotations

import pytest
from tritonclient.grpc import service_pb2_grpc

from gateway.access import (
    API_GROUPS,
    GRPC_GROUPS,
    HTTP_GROUPS,
    AccessPolicy,
    grpc_group,
    grpc_headers,
)
from gateway.http import _routes
from naiad.errors import GRPC_CODES, Unauthenticated
from naiad_cli.commands import _settings, build_parser, main

KEY = "Bearer k3y-Of-32-characters-long-000"


def test_every_http_route_has_a_group():
    patterns = {route.path for route in _routes()}
    assert patterns - set(HTTP_GROUPS) == set()
    assert set(HTTP_GROUPS) - patterns == {"/metrics"}  # the metrics port's one route
    assert set(HTTP_GROUPS.values()) <= set(API_GROUPS)


def test_every_grpc_method_has_a_group():
    methods = {
        name for name in dir(service_pb2_grpc.GRPCInferenceServiceServicer) if not name.startswith("_")
    }
    assert methods == set(GRPC_GROUPS)
    assert grpc_group("/inference.GRPCInferenceService/ModelInfer") == "inference"
    assert grpc_group("/other.Service/ModelInfer") is None
    assert grpc_group("garbage") is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("inference", "must be"),
        ("inference:Authorization", "must be"),
        ("inference:=v", "must be"),
        ("inference:k=", "must be"),
        ("infer:k=v", "unknown API"),
        ("inference,,health:k=v", "unknown API"),
    ],
)
def test_malformed_groups_are_refused_without_echoing_the_value(spec, message):
    with pytest.raises(ValueError, match=message) as caught:
        AccessPolicy([spec.replace("=v", "=SECRETVALUE")])
    assert "SECRETVALUE" not in str(caught.value)


def test_an_api_in_two_groups_is_refused():
    with pytest.raises(ValueError, match="multiple config groups"):
        AccessPolicy(["model-repository,health:k1=v1", "metadata,health:k2=v2"])


def test_value_may_hold_colons_and_equals_and_the_key_is_case_insensitive():
    policy = AccessPolicy(["inference:X-Key=a:b=c"])
    policy.check("inference", {"x-key": "a:b=c"})
    with pytest.raises(Unauthenticated):
        policy.check("inference", {"x-key": "a:b"})


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": KEY[:-1] + "1"},  # same length, last character differs
        {"authorization": KEY + "0"},  # longer
        {"authorization": "Bearer"},  # shorter
        {"authorization": KEY.lower()},  # values are case-sensitive
        {"x-other": KEY},
    ],
    ids=["missing", "same-length", "longer", "shorter", "case", "other-header"],
)
def test_wrong_or_missing_credentials_are_unauthenticated(headers):
    policy = AccessPolicy([f"inference,statistics:Authorization={KEY}"])
    with pytest.raises(Unauthenticated) as caught:
        policy.check("inference", headers)
    assert KEY not in caught.value.message and "k3y" not in caught.value.message
    assert caught.value.status == 401 and GRPC_CODES[Unauthenticated] == "UNAUTHENTICATED"
    assert caught.value.headers == {"WWW-Authenticate": 'Bearer realm="naiad"'}


def test_right_credentials_and_open_groups_pass():
    policy = AccessPolicy([f"inference:Authorization={KEY}"])
    policy.check("inference", {"authorization": KEY})
    policy.check("metadata", {})  # not restricted
    policy.check(None, {})  # unknown route: its 404 comes later
    assert not AccessPolicy([])


def test_grpc_reads_triton_prefixed_or_plain_metadata():
    policy = AccessPolicy(["model-repository:admin-key=v4lue"], "--grpc-restricted-protocol")
    policy.check("model-repository", {"triton-grpc-protocol-admin-key": "v4lue"}, grpc=True)
    policy.check("model-repository", {"admin-key": "v4lue"}, grpc=True)
    with pytest.raises(Unauthenticated, match="triton-grpc-protocol-admin-key"):
        policy.check("model-repository", {"triton-grpc-protocol-admin-key": "v4lu3"}, grpc=True)
    # Triton's prefixed form wins when both are sent.
    with pytest.raises(Unauthenticated):
        policy.check(
            "model-repository",
            {"triton-grpc-protocol-admin-key": "wrong", "admin-key": "v4lue"},
            grpc=True,
        )


def test_grpc_headers_lowercases_and_skips_binary_values():
    headers = grpc_headers([("Authorization", "a"), ("authorization", "b"), ("x-bin", b"\0")])
    assert headers == {"authorization": "a"}
    assert grpc_headers(None) == {}


def test_the_restriction_repr_hides_the_value():
    policy = AccessPolicy([f"inference:Authorization={KEY}"])
    assert KEY not in repr(policy.groups) and "k3y" not in repr(policy.groups)


def test_flags_are_repeatable_and_reach_the_settings():
    argv = [
        "gateway", "--redis-url", "redis://x",
        "--http-restricted-api", f"inference:Authorization={KEY}",
        "--http-restricted-api", "model-repository,statistics:Authorization=Bearer other",
        "--grpc-restricted-protocol", "health:k=v", "--metrics-address", "127.0.0.1",
    ]  # fmt: skip
    settings = _settings(build_parser().parse_args(argv))
    assert len(settings.http_restricted_api) == 2 and settings.grpc_restricted_protocol == ["health:k=v"]
    assert settings.metrics_address == "127.0.0.1"
    assert KEY not in repr(settings) and "k3y" not in repr(settings)


def test_a_malformed_flag_stops_the_command_without_echoing_the_key(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["gateway", "--redis-url", "redis://x", "--http-restricted-api", "inferenc:k=SECRETVALUE"])
    assert caught.value.code == 2
    assert "unknown API" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["gateway", "--redis-url", "redis://x", "--grpc-restricted-protocol", "health:SECRETVALUE"])
    assert "SECRETVALUE" not in capsys.readouterr().err
