"""The requests of the differential suite, good and bad, as exact HTTP bodies and headers
and as gRPC messages. Each case has an id that the accepted-differences table names.

HTTP cases are ``HttpCase(id, method, path, body, headers)``: sent byte for byte, no header
added but ``Host`` and ``Content-Length``. gRPC cases are ``GrpcCase(id, method, message)``
on ``inference.GRPCInferenceService``.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2
from tritonclient.utils import serialize_byte_tensor

from naiad.datatypes import numpy_dtype
from tests.differential.repository import DATATYPES

H = "Inference-Header-Content-Length"


@dataclass
class HttpCase:
    id: str
    method: str
    path: str
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    message: bool = False
    """Compare the error message text too (where Triton's wording is the contract)."""


@dataclass
class GrpcCase:
    id: str
    method: str
    message: Any


# One example value list per datatype, shape [1, 3] (batching models) unless noted.
VALUES: dict[str, list[Any]] = {
    "BOOL": [True, False, True],
    "UINT8": [0, 7, 255],
    "UINT16": [0, 7, 65535],
    "UINT32": [0, 7, 4294967295],
    "UINT64": [0, 7, 18446744073709551615],
    "INT8": [-128, 0, 127],
    "INT16": [-32768, 0, 32767],
    "INT32": [-2147483648, 0, 2147483647],
    "INT64": [-9223372036854775808, 0, 9223372036854775807],
    "FP16": [0.5, -2.0, 65504.0],
    "FP32": [0.25, -1.5, 3.0e38],
    "FP64": [0.1, -1e300, 2.5],
    "BYTES": ["a", "héllo", ""],
}


def raw(datatype: str, values: list[Any]) -> bytes:
    """The binary extension's bytes for ``values`` (BYTES: 4-byte length prefixes)."""
    if datatype == "BYTES":
        return serialize_byte_tensor(
            np.array([v.encode() if isinstance(v, str) else v for v in values], dtype=np.object_)
        ).item()
    return np.array(values, dtype=numpy_dtype(datatype)).tobytes()


def js(value: Any) -> bytes:
    return json.dumps(value).encode()


def jtensor(name: str, datatype: str, shape: list[int], data: Any, **parameters: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape, "data": data}
    if parameters:
        item["parameters"] = parameters
    return item


def binary_body(header: dict[str, Any], chunks: list[bytes]) -> tuple[bytes, dict[str, str]]:
    head = js(header)
    return head + b"".join(chunks), {H: str(len(head)), "Content-Type": "application/octet-stream"}


def infer(
    model: str, body: bytes, headers: dict[str, str] | None = None, version: str = ""
) -> tuple[str, bytes, dict[str, str]]:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    return path, body, {"Content-Type": "application/json", **(headers or {})}


def _case(
    case_id: str,
    model: str,
    body: bytes,
    headers: dict[str, str] | None = None,
    version: str = "",
    message: bool = False,
) -> HttpCase:
    path, body, headers = infer(model, body, headers, version)
    return HttpCase(case_id, "POST", path, body, headers, message)


def _metadata_cases() -> list[HttpCase]:
    cases = [
        HttpCase("live", "GET", "/v2/health/live"),
        HttpCase("ready", "GET", "/v2/health/ready"),
        HttpCase("server_metadata", "GET", "/v2"),
        HttpCase("unknown_route", "GET", "/v2/nothing/here"),
        HttpCase("index", "POST", "/v2/repository/index", b"{}"),
        HttpCase("index_ready", "POST", "/v2/repository/index", b'{"ready": true}'),
        HttpCase("index_bad_json", "POST", "/v2/repository/index", b"{nope"),
    ]
    models = [
        "identity",
        "fixed",
        "add_sub",
        "versioned",
        "versioned_latest",
        "versioned_specific",
        "versioned_default",
        "batcher",
        "cached",
        "failing",
        "ens",
    ]
    for model in models:
        cases += [
            HttpCase(f"metadata/{model}", "GET", f"/v2/models/{model}"),
            HttpCase(f"ready/{model}", "GET", f"/v2/models/{model}/ready"),
            HttpCase(f"config/{model}", "GET", f"/v2/models/{model}/config"),
        ]
    for model in ("versioned", "versioned_latest", "versioned_specific", "versioned_default"):
        for version in ("1", "2", "3", "4"):
            cases += [
                HttpCase(f"metadata/{model}/v{version}", "GET", f"/v2/models/{model}/versions/{version}"),
                HttpCase(f"ready/{model}/v{version}", "GET", f"/v2/models/{model}/versions/{version}/ready"),
                _case(
                    f"infer/{model}/v{version}",
                    model,
                    js({"inputs": [jtensor("IN", "FP32", [1, 1], [1.0])]}),
                    version=version,
                ),
            ]
    cases += [
        HttpCase("metadata/unknown", "GET", "/v2/models/nope"),
        HttpCase("ready/unknown", "GET", "/v2/models/nope/ready"),
        HttpCase("config/unknown", "GET", "/v2/models/nope/config"),
        HttpCase("metadata/version_word", "GET", "/v2/models/identity/versions/abc"),
        HttpCase("stats/unknown", "GET", "/v2/models/nope/stats"),
        _case("infer/unknown", "nope", js({"inputs": [jtensor("IN", "FP32", [1], [1.0])]})),
    ]
    return cases


def _fixed(values: list[float], strings: list[str], shape: list[int] = (2, 3), **extra: Any) -> bytes:  # type: ignore[assignment]
    """A body for ``fixed``: its FP32 input of ``shape`` and its BYTES input."""
    inputs = [jtensor("IN_FP32", "FP32", list(shape), values), jtensor("IN_BYTES", "BYTES", [2], strings)]
    return js({"inputs": inputs, **extra})


def _identity(*inputs: dict[str, Any], **extra: Any) -> bytes:
    return js({"inputs": list(inputs), **extra})


def _datatype_cases() -> list[HttpCase]:
    cases = []
    for dt in DATATYPES:
        values = VALUES[dt]
        if dt != "FP16":
            cases.append(_case(f"json/{dt}", "identity", _identity(jtensor(f"IN_{dt}", dt, [1, 3], values))))
            cases.append(
                _case(f"json_nested/{dt}", "identity", _identity(jtensor(f"IN_{dt}", dt, [1, 3], [values])))
            )
        spec = {
            "name": f"IN_{dt}",
            "datatype": dt,
            "shape": [1, 3],
            "parameters": {"binary_data_size": len(raw(dt, values))},
        }
        body, headers = binary_body(
            {"inputs": [spec], "parameters": {"binary_data_output": True}}, [raw(dt, values)]
        )
        cases.append(_case(f"binary/{dt}", "identity", body, headers))
        body, headers = binary_body(
            {"inputs": [spec], "outputs": [{"name": f"OUT_{dt}", "parameters": {"binary_data": False}}]},
            [raw(dt, values)],
        )
        cases.append(_case(f"binary_in_json_out/{dt}", "identity", body, headers, message=dt == "FP16"))
        if dt == "FP16":
            empty = {**spec, "shape": [1, 0], "parameters": {"binary_data_size": 0}}
            body, headers = binary_body({"inputs": [empty], "parameters": {"binary_data_output": True}}, [])
            cases.append(_case(f"empty/{dt}", "identity", body, headers))
        else:
            cases.append(_case(f"empty/{dt}", "identity", _identity(jtensor(f"IN_{dt}", dt, [1, 0], []))))
    cases += [
        _case(
            "json/all_types",
            "identity",
            _identity(*[jtensor(f"IN_{dt}", dt, [1, 3], VALUES[dt]) for dt in DATATYPES if dt != "FP16"]),
        ),
        _case("json/batch8", "identity", _identity(jtensor("IN_INT32", "INT32", [8, 1], list(range(8))))),
        _case("bad/batch9", "identity", _identity(jtensor("IN_INT32", "INT32", [9, 1], list(range(9))))),
        _case(
            "json/fp16_input", "identity", _identity(jtensor("IN_FP16", "FP16", [1, 1], [1.0])), message=True
        ),
        _case("json/bf16_input", "identity", _identity(jtensor("IN_FP16", "BF16", [1, 1], [1.0]))),
        _case(
            "json/fp16_output_default", "identity", js({"inputs": [jtensor("IN_INT8", "INT8", [1, 1], [1])]})
        ),
    ]
    return cases


def _binary_cases() -> list[HttpCase]:
    data = raw("FP32", [1.0, 2.0])
    spec = {"name": "IN_FP32", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}}
    cases = []

    def add(
        case_id: str, header: dict[str, Any], chunks: list[bytes], message: bool = False, **hdrs: str
    ) -> None:
        body, headers = binary_body(header, chunks)
        headers.update(hdrs)
        cases.append(_case(case_id, "identity", body, headers, message=message))

    add(
        "binary/output_mixed",
        {
            "inputs": [spec, jtensor("IN_INT16", "INT16", [1, 2], [3, 4])],
            "outputs": [{"name": "OUT_FP32", "parameters": {"binary_data": True}}, {"name": "OUT_INT16"}],
        },
        [data],
    )
    add(
        "binary/output_false_overrides",
        {
            "inputs": [spec],
            "outputs": [{"name": "OUT_FP32", "parameters": {"binary_data": False}}],
            "parameters": {"binary_data_output": True},
        },
        [data],
    )
    add(
        "bad/binary_data_output_string",
        {"inputs": [spec], "parameters": {"binary_data_output": "false"}},
        [data],
    )
    add("bad/binary_data_output_int", {"inputs": [spec], "parameters": {"binary_data_output": 1}}, [data])
    add(
        "bad/binary_data_string",
        {"inputs": [spec], "outputs": [{"name": "OUT_FP32", "parameters": {"binary_data": "true"}}]},
        [data],
    )
    add("bad/data_and_binary_size", {"inputs": [{**spec, "data": [1.0, 2.0]}]}, [data], message=True)
    add("bad/binary_size_past_body", {"inputs": [{**spec, "parameters": {"binary_data_size": 12}}]}, [data])
    add("bad/binary_leftover", {"inputs": [spec]}, [data, b"xx"])
    add("bad/binary_size_negative", {"inputs": [{**spec, "parameters": {"binary_data_size": -1}}]}, [data])
    add("bad/binary_size_wrong_for_shape", {"inputs": [{**spec, "shape": [1, 3]}]}, [data])
    add(
        "bad/binary_bytes_truncated",
        {
            "inputs": [
                {
                    "name": "IN_BYTES",
                    "datatype": "BYTES",
                    "shape": [1, 2],
                    "parameters": {"binary_data_size": 6},
                }
            ]
        },
        [b"\x05\x00\x00\x00ab"],
    )
    body, headers = binary_body({"inputs": [spec]}, [data])
    cases += [
        _case("bad/header_length_past_body", "identity", body, {**headers, H: str(len(body) + 5)}),
        _case("bad/header_length_word", "identity", body, {**headers, H: "ten"}),
        _case("bad/header_length_short", "identity", body, {**headers, H: "5"}),
        _case(
            "raw/two_inputs",
            "fixed",
            raw("FP32", [1, 2, 3, 4, 5, 6]),
            {H: "0", "Content-Type": "application/octet-stream"},
        ),
        _case(
            "raw/many_optional_inputs", "identity", data, {H: "0", "Content-Type": "application/octet-stream"}
        ),
        _case(
            "raw/no_batch", "failing", raw("INT32", [0]), {H: "0", "Content-Type": "application/octet-stream"}
        ),
        _case(
            "raw/batching",
            "versioned",
            raw("FP32", [1.0]),
            {H: "0", "Content-Type": "application/octet-stream"},
        ),
        _case(
            "raw/too_long",
            "versioned",
            raw("FP32", [1.0, 2.0]),
            {H: "0", "Content-Type": "application/octet-stream"},
        ),
        _case("raw/too_short", "failing", b"abc", {H: "0", "Content-Type": "application/octet-stream"}),
        _case("raw/empty", "failing", b"", {H: "0", "Content-Type": "application/octet-stream"}),
    ]
    return cases


def _bad_json_cases() -> list[HttpCase]:
    t = jtensor
    return [
        _case("bad/malformed_json", "identity", b'{"inputs": ['),
        _case("bad/body_array", "identity", b"[1, 2]"),
        _case("bad/empty_body", "identity", b""),
        _case("bad/no_inputs", "identity", b"{}"),
        _case("bad/inputs_empty", "identity", js({"inputs": []})),
        _case("bad/inputs_not_list", "identity", js({"inputs": {"name": "IN_INT8"}})),
        _case(
            "bad/input_no_name",
            "identity",
            js({"inputs": [{"datatype": "INT8", "shape": [1, 1], "data": [1]}]}),
        ),
        _case(
            "bad/input_no_datatype",
            "identity",
            js({"inputs": [{"name": "IN_INT8", "shape": [1, 1], "data": [1]}]}),
        ),
        _case(
            "bad/input_no_shape",
            "identity",
            js({"inputs": [{"name": "IN_INT8", "datatype": "INT8", "data": [1]}]}),
        ),
        _case(
            "bad/input_no_data",
            "identity",
            js({"inputs": [{"name": "IN_INT8", "datatype": "INT8", "shape": [1, 1]}]}),
        ),
        _case("bad/unknown_input", "identity", _identity(t("IN_NOPE", "INT8", [1, 1], [1]))),
        _case(
            "bad/duplicate_input",
            "identity",
            _identity(t("IN_INT8", "INT8", [1, 1], [1]), t("IN_INT8", "INT8", [1, 1], [1])),
        ),
        _case("bad/wrong_datatype", "identity", _identity(t("IN_INT8", "INT16", [1, 1], [1]))),
        _case("bad/unknown_datatype", "identity", _identity(t("IN_INT8", "INT7", [1, 1], [1]))),
        _case("bad/wrong_rank", "identity", _identity(t("IN_INT8", "INT8", [3], [1, 2, 3]))),
        _case("bad/count_mismatch", "identity", _identity(t("IN_INT8", "INT8", [1, 3], [1, 2]))),
        _case("bad/float_for_int", "identity", _identity(t("IN_INT8", "INT8", [1, 1], [1.5]))),
        _case("bad/out_of_range", "identity", _identity(t("IN_INT8", "INT8", [1, 1], [300]))),
        _case("bad/string_for_number", "identity", _identity(t("IN_FP32", "FP32", [1, 1], ["1.0"]))),
        _case("bad/null_value", "identity", _identity(t("IN_FP32", "FP32", [1, 1], [None]))),
        _case("bad/number_for_bytes", "identity", _identity(t("IN_BYTES", "BYTES", [1, 1], [1]))),
        _case("bad/negative_dim", "identity", _identity(t("IN_INT8", "INT8", [1, -1], [1]))),
        _case("bad/shape_not_list", "identity", _identity(t("IN_INT8", "INT8", 1, [1]))),  # type: ignore[arg-type]
        _case(
            "bad/unknown_output",
            "identity",
            _identity(t("IN_INT8", "INT8", [1, 1], [1]), outputs=[{"name": "OUT_NOPE"}]),
        ),
        _case("bad/output_no_name", "identity", _identity(t("IN_INT8", "INT8", [1, 1], [1]), outputs=[{}])),
        _case("bad/id_number", "identity", _identity(t("IN_INT8", "INT8", [1, 1], [1]), id=5)),
        _case(
            "bad/parameters_list", "identity", _identity(t("IN_INT8", "INT8", [1, 1], [1]), parameters=[1])
        ),
        _case("good/id_echo", "identity", _identity(t("IN_INT8", "INT8", [1, 1], [1]), id="req-42")),
        _case("good/empty_id", "identity", _identity(t("IN_INT8", "INT8", [1, 1], [1]), id="")),
        _case(
            "good/requested_output",
            "identity",
            _identity(
                t("IN_INT8", "INT8", [1, 1], [1]),
                t("IN_INT16", "INT16", [1, 1], [2]),
                outputs=[{"name": "OUT_INT16"}],
            ),
        ),
        _case("good/bool_values", "identity", _identity(t("IN_BOOL", "BOOL", [2, 1], [True, False]))),
        _case("bad/bool_as_int", "identity", _identity(t("IN_BOOL", "BOOL", [1, 1], [1]))),
        _case(
            "good/unicode_bytes",
            "fixed",
            _fixed([1, 2, 3, 4, 5, 6], ["日本", "x"]),
        ),
        _case(
            "bad/fixed_wrong_dims",
            "fixed",
            _fixed([1, 2, 3, 4, 5, 6], ["a", "b"], shape=[3, 2]),
        ),
        _case(
            "bad/fixed_missing_input",
            "fixed",
            js({"inputs": [t("IN_FP32", "FP32", [2, 3], [1, 2, 3, 4, 5, 6])]}),
        ),
        HttpCase("bad/infer_get", "GET", "/v2/models/identity/infer"),
    ]


def _encoding_cases() -> list[HttpCase]:
    """HTTP compression: gzip and deflate request bodies, compressed answers asked for."""
    body = _identity(jtensor("IN_INT32", "INT32", [1, 4], [1, 2, 3, 4]))
    cases = [
        _case("encoding/request_gzip", "identity", gzip.compress(body), {"Content-Encoding": "gzip"}),
        _case("encoding/request_deflate", "identity", zlib.compress(body), {"Content-Encoding": "deflate"}),
        _case("encoding/request_corrupt_gzip", "identity", b"\x1f\x8bnot gzip", {"Content-Encoding": "gzip"}),
        _case("encoding/request_unknown", "identity", body, {"Content-Encoding": "br"}),
    ]
    for accept in ("gzip", "deflate", "gzip;q=0, deflate", "identity", "br"):
        cases.append(_case(f"encoding/accept={accept}", "identity", body, {"Accept-Encoding": accept}))
    big = _identity(jtensor("IN_FP64", "FP64", [1, 512], [0.5] * 512))
    cases.append(_case("encoding/accept_gzip_large", "identity", big, {"Accept-Encoding": "gzip"}))
    return cases


def _parameter_cases() -> list[HttpCase]:
    """Request parameters: the schedule policy's, unknown ones (passed through), odd types.
    Not sent, as they kill Triton 2.51 (Naiad: ``sequence_id`` is passed to the model, a
    classification of a BYTES output is 400): ``sequence_id`` on a model without a sequence
    batcher, ``classification`` of a BYTES output."""
    one = jtensor("IN_INT8", "INT8", [1, 1], [1])
    cases = []
    for name, value in [("priority", 1), ("priority", 0), ("timeout", 1000000), ("timeout", 0),
                        ("priority", -1), ("priority", "high"), ("timeout", 1.5), ("timeout", True),
                        ("custom", "x"), ("custom", 3), ("custom", 1.5), ("custom", -3),
                        ("custom", {"a": 1}), ("custom", [1]), ("custom", None),
                         ("binary_data_output", False)]:  # fmt: skip
        body = _identity(one, parameters={name: value})
        cases.append(_case(f"params/{name}={json.dumps(value)}", "identity", body))
    cases += [
        _case(
            "params/output_unknown_parameter",
            "identity",
            _identity(one, outputs=[{"name": "OUT_INT8", "parameters": {"custom": 1}}]),
        ),  # fmt: skip
        _case(
            "params/input_unknown_parameter",
            "identity",
            _identity(jtensor("IN_INT8", "INT8", [1, 1], [1], custom=1)),
        ),  # fmt: skip
        _case(
            "bytes/binary_output",
            "fixed",
            _fixed(
                [1, 2, 3, 4, 5, 6],
                ["a", "bc"],
                outputs=[{"name": "OUT_BYTES", "parameters": {"binary_data": True}}],
            ),
        ),  # fmt: skip
        _case(
            "fixed/class_fp32",
            "fixed",
            _fixed(
                [1, 9, 3, 4, 5, 6],
                ["a", "bc"],
                outputs=[{"name": "OUT_FP32", "parameters": {"classification": 2}}],
            ),
        ),  # fmt: skip
        _case(
            "identity/class_batch",
            "identity",
            _identity(
                jtensor("IN_FP32", "FP32", [2, 3], [1, 5, 3, 9, 2, 0]),
                outputs=[{"name": "OUT_FP32", "parameters": {"classification": 2}}],
            ),
        ),  # fmt: skip
        _case(
            "identity/class_bool",
            "identity",
            _identity(
                jtensor("IN_BOOL", "BOOL", [1, 2], [True, False]),
                outputs=[{"name": "OUT_BOOL", "parameters": {"classification": 1}}],
            ),
        ),  # fmt: skip
        _case(
            "identity/batch_mismatch",
            "identity",
            _identity(jtensor("IN_INT8", "INT8", [1, 1], [1]), jtensor("IN_INT16", "INT16", [2, 1], [1, 2])),
        ),  # fmt: skip
        *_encoding_cases(),
        HttpCase("bad/infer_on_stats_path", "POST", "/v2/models/identity/stats", b"{}"),
        HttpCase("bad/config_post", "POST", "/v2/models/identity/config", b"{}"),
        _case(
            "bad/version_zero",
            "versioned",
            js({"inputs": [jtensor("IN", "FP32", [1, 1], [1.0])]}),
            version="0",
        ),
        _case(
            "bad/version_negative",
            "versioned",
            js({"inputs": [jtensor("IN", "FP32", [1, 1], [1.0])]}),
            version="-1",
        ),
    ]
    return cases


def _add_sub(*, outputs: list[dict[str, Any]] | None = None, **extra: Any) -> bytes:
    body: dict[str, Any] = {
        "inputs": [jtensor("INPUT0", "FP32", [4], [1, 2, 3, 4]), jtensor("INPUT1", "FP32", [4], [4, 1, 2, 0])]
    }
    if outputs is not None:
        body["outputs"] = outputs
    return js({**body, **extra})


def _model_cases() -> list[HttpCase]:
    cls = lambda n, name="OUTPUT0": [{"name": name, "parameters": {"classification": n}}]  # noqa: E731
    cases = [
        _case("add_sub/plain", "add_sub", _add_sub()),
        *[
            _case(f"asked/{'_'.join(names) or 'all'}", "asked", js({
                "inputs": [jtensor("IN", "FP32", [1], [1.0])],
                **({"outputs": [{"name": n} for n in names]} if names else {}),
            }))  # fmt: skip
            for names in [(), ("ASKED",), ("OTHER", "ASKED")]
        ],
        _case("asked/parameters", "asked", js({
            "inputs": [jtensor("IN", "FP32", [1], [1.0])],
            "parameters": {"s": "hé", "i": 3, "b": True, "sequence_id": 5, "sequence_start": True},
        })),  # fmt: skip
        *[_case(f"sent/{m}", "sent", js({"inputs": [jtensor("IN", "FP32", [1], [m])]})) for m in (0, 1, 2)],
        _case("bad/triton_parameter", "asked", js({
            "inputs": [jtensor("IN", "FP32", [1], [1.0])], "parameters": {"i": 3, "triton_x": 1},
        }), message=True),  # fmt: skip
        _case("add_sub/class2", "add_sub", _add_sub(outputs=cls(2))),
        _case("add_sub/class10", "add_sub", _add_sub(outputs=cls(10))),
        _case("add_sub/class_int", "add_sub", _add_sub(outputs=cls(3, "OUTPUT1"))),
        _case(
            "add_sub/class_binary",
            "add_sub",
            _add_sub(outputs=[{"name": "OUTPUT0", "parameters": {"classification": 2, "binary_data": True}}]),
        ),
        _case("add_sub/class_zero", "add_sub", _add_sub(outputs=cls(0))),
        _case("bad/class_negative", "add_sub", _add_sub(outputs=cls(-1))),
        _case("bad/class_string", "add_sub", _add_sub(outputs=cls("2"))),
        _case(
            "add_sub/batch_dim_refused",
            "add_sub",
            js(
                {
                    "inputs": [
                        jtensor("INPUT0", "FP32", [1, 4], [1, 2, 3, 4]),
                        jtensor("INPUT1", "FP32", [1, 4], [1, 2, 3, 4]),
                    ]
                }
            ),
        ),
        _case(
            "ens/plain",
            "ens",
            js(
                {"inputs": [jtensor("A", "FP32", [4], [1, 2, 3, 4]), jtensor("B", "FP32", [4], [1, 1, 1, 1])]}
            ),
        ),
        _case(
            "ens/one_output",
            "ens",
            js(
                {
                    "inputs": [
                        jtensor("A", "FP32", [4], [1, 2, 3, 4]),
                        jtensor("B", "FP32", [4], [1, 1, 1, 1]),
                    ],
                    "outputs": [{"name": "FINAL"}],
                }
            ),
        ),
        _case("ens/bad_input", "ens", js({"inputs": [jtensor("A", "FP32", [4], [1, 2, 3, 4])]})),
        _case(
            "ens/unknown_output",
            "ens",
            js(
                {
                    "inputs": [
                        jtensor("A", "FP32", [4], [1, 2, 3, 4]),
                        jtensor("B", "FP32", [4], [1, 1, 1, 1]),
                    ],
                    "outputs": [{"name": "DIFF"}],
                }
            ),
        ),
    ]
    objects = {"inputs": [jtensor("IN", "FP32", [1], [1.0])]}  # BYTES outputs not built of bytes
    body, headers = binary_body({**objects, "parameters": {"binary_data_output": True}}, [])
    one_binary = [{"name": "OUTS", "parameters": {"binary_data": True}}, {"name": "OUTS_S"}]
    cases += [
        _case("objects/json", "objects", js(objects)),
        _case("objects/binary", "objects", body, headers),
        _case("objects/binary_one", "objects", js({**objects, "outputs": one_binary})),
    ]
    for model in ("args", "args_default"):
        cases.append(_case(f"{model}/initialize", model, js({"inputs": [jtensor("IN", "INT32", [1], [0])]})))
    for code in (0, 1, 2, 3, 4, 5, 6, 7, 8, 99):
        cases.append(
            _case(
                f"failing/{code}",
                "failing",
                js({"inputs": [jtensor("CODE", "INT32", [1], [code])]}),
                message=code != 99,
            )
        )
    return cases


def http_cases() -> list[HttpCase]:
    """Every HTTP case, in the order sent (unique ids)."""
    cases = (_metadata_cases() + _datatype_cases() + _binary_cases() + _bad_json_cases() + _model_cases()
             + _parameter_cases())  # fmt: skip
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    return cases


# ---------------------------------------------------------------------------------- gRPC


def _grpc_input(
    name: str,
    datatype: str,
    shape: list[int],
    values: list[Any] | None = None,
    contents: dict[str, Any] | None = None,
) -> service_pb2.ModelInferRequest.InferInputTensor:
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)
    if contents is not None:
        json_format.ParseDict({"contents": contents}, tensor)
    return tensor


def grpc_infer(
    model: str,
    inputs: list[tuple[service_pb2.ModelInferRequest.InferInputTensor, bytes | None]],
    outputs: list[str] = (),
    version: str = "",
    **fields: Any,
) -> service_pb2.ModelInferRequest:  # type: ignore[assignment]
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version, **fields)
    for tensor, data in inputs:
        request.inputs.append(tensor)
        if data is not None:
            request.raw_input_contents.append(data)
    for name in outputs:
        request.outputs.append(service_pb2.ModelInferRequest.InferRequestedOutputTensor(name=name))
    return request


def grpc_cases() -> list[GrpcCase]:
    s = service_pb2
    cases = [
        GrpcCase("live", "ServerLive", s.ServerLiveRequest()),
        GrpcCase("ready", "ServerReady", s.ServerReadyRequest()),
        GrpcCase("server_metadata", "ServerMetadata", s.ServerMetadataRequest()),
        GrpcCase("index", "RepositoryIndex", s.RepositoryIndexRequest()),
        GrpcCase("metadata/unknown", "ModelMetadata", s.ModelMetadataRequest(name="nope")),
        GrpcCase("ready/unknown", "ModelReady", s.ModelReadyRequest(name="nope")),
        GrpcCase("config/unknown", "ModelConfig", s.ModelConfigRequest(name="nope")),
        GrpcCase("stats/unknown", "ModelStatistics", s.ModelStatisticsRequest(name="nope")),
    ]
    for model in (
        "identity",
        "fixed",
        "add_sub",
        "versioned",
        "versioned_latest",
        "versioned_specific",
        "versioned_default",
        "batcher",
        "cached",
        "failing",
        "ens",
    ):
        cases += [
            GrpcCase(f"metadata/{model}", "ModelMetadata", s.ModelMetadataRequest(name=model)),
            GrpcCase(f"ready/{model}", "ModelReady", s.ModelReadyRequest(name=model)),
            GrpcCase(f"config/{model}", "ModelConfig", s.ModelConfigRequest(name=model)),
        ]
    for model in ("versioned", "versioned_latest", "versioned_specific"):
        for version in ("1", "2", "3", "4"):
            cases += [
                GrpcCase(
                    f"metadata/{model}/v{version}",
                    "ModelMetadata",
                    s.ModelMetadataRequest(name=model, version=version),
                ),
                GrpcCase(
                    f"ready/{model}/v{version}",
                    "ModelReady",
                    s.ModelReadyRequest(name=model, version=version),
                ),
                GrpcCase(
                    f"infer/{model}/v{version}",
                    "ModelInfer",
                    grpc_infer(
                        model, [(_grpc_input("IN", "FP32", [1, 1]), raw("FP32", [1.0]))], version=version
                    ),
                ),
            ]
    for dt in DATATYPES:
        data = raw(dt, VALUES[dt])
        cases.append(
            GrpcCase(
                f"raw/{dt}",
                "ModelInfer",
                grpc_infer("identity", [(_grpc_input(f"IN_{dt}", dt, [1, 3]), data)]),
            )
        )
    contents = {
        "BOOL": ("bool_contents", VALUES["BOOL"]),
        "INT8": ("int_contents", VALUES["INT8"]),
        "INT32": ("int_contents", VALUES["INT32"]),
        "INT64": ("int64_contents", [str(v) for v in VALUES["INT64"]]),
        "UINT8": ("uint_contents", VALUES["UINT8"]),
        "UINT64": ("uint64_contents", [str(v) for v in VALUES["UINT64"]]),
        "FP32": ("fp32_contents", VALUES["FP32"]),
        "FP64": ("fp64_contents", VALUES["FP64"]),
    }
    for dt, (fname, values) in contents.items():
        cases.append(
            GrpcCase(
                f"contents/{dt}",
                "ModelInfer",
                grpc_infer(
                    "identity", [(_grpc_input(f"IN_{dt}", dt, [1, 3], contents={fname: values}), None)]
                ),
            )
        )
    cases.append(
        GrpcCase(
            "contents/BYTES",
            "ModelInfer",
            grpc_infer(
                "identity",
                [
                    (
                        _grpc_input(
                            "IN_BYTES", "BYTES", [1, 2], contents={"bytes_contents": ["YQ==", "Yg=="]}
                        ),
                        None,
                    )
                ],
            ),
        )
    )
    fp32 = raw("FP32", [1.0, 2.0])

    def add() -> list:
        return [
            (_grpc_input("INPUT0", "FP32", [4]), raw("FP32", [1, 2, 3, 4])),  # noqa: E731
            (_grpc_input("INPUT1", "FP32", [4]), raw("FP32", [4, 1, 2, 0])),
        ]

    classification = s.ModelInferRequest.InferRequestedOutputTensor(name="OUTPUT0")
    classification.parameters["classification"].int64_param = 2
    class_request = grpc_infer("add_sub", add())
    class_request.outputs.append(classification)
    cases += [
        GrpcCase(
            "bad/unknown_model",
            "ModelInfer",
            grpc_infer("nope", [(_grpc_input("IN", "FP32", [1]), raw("FP32", [1]))]),
        ),
        GrpcCase("bad/no_inputs", "ModelInfer", grpc_infer("identity", [])),
        GrpcCase(
            "bad/unknown_input",
            "ModelInfer",
            grpc_infer("identity", [(_grpc_input("IN_NOPE", "FP32", [1, 2]), fp32)]),
        ),
        GrpcCase(
            "bad/wrong_datatype",
            "ModelInfer",
            grpc_infer("identity", [(_grpc_input("IN_FP32", "FP64", [1, 1]), fp32)]),
        ),
        GrpcCase(
            "bad/raw_size",
            "ModelInfer",
            grpc_infer("identity", [(_grpc_input("IN_FP32", "FP32", [1, 3]), fp32)]),
        ),
        GrpcCase(
            "bad/raw_and_contents",
            "ModelInfer",
            grpc_infer(
                "identity",
                [(_grpc_input("IN_FP32", "FP32", [1, 2], contents={"fp32_contents": [1.0, 2.0]}), fp32)],
            ),
        ),
        GrpcCase(
            "bad/raw_count_mismatch",
            "ModelInfer",
            grpc_infer(
                "identity", [(_grpc_input("IN_FP32", "FP32", [1, 2]), None)], raw_input_contents=[fp32, fp32]
            ),
        ),
        GrpcCase(
            "bad/contents_wrong_field",
            "ModelInfer",
            grpc_infer(
                "identity",
                [(_grpc_input("IN_FP32", "FP32", [1, 2], contents={"int_contents": [1, 2]}), None)],
            ),
        ),
        GrpcCase(
            "bad/batch9",
            "ModelInfer",
            grpc_infer(
                "identity", [(_grpc_input("IN_INT32", "INT32", [9, 1]), raw("INT32", list(range(9))))]
            ),
        ),
        GrpcCase(
            "bad/unknown_output",
            "ModelInfer",
            grpc_infer("identity", [(_grpc_input("IN_FP32", "FP32", [1, 2]), fp32)], outputs=["OUT_NOPE"]),
        ),
        GrpcCase(
            "bad/version_word",
            "ModelInfer",
            grpc_infer("identity", [(_grpc_input("IN_FP32", "FP32", [1, 2]), fp32)], version="abc"),
        ),
        GrpcCase(
            "good/id",
            "ModelInfer",
            grpc_infer("identity", [(_grpc_input("IN_FP32", "FP32", [1, 2]), fp32)], id="abc"),
        ),
        GrpcCase("add_sub/plain", "ModelInfer", grpc_infer("add_sub", add())),
        GrpcCase("add_sub/class2", "ModelInfer", class_request),
        GrpcCase(
            "ens/plain",
            "ModelInfer",
            grpc_infer(
                "ens",
                [
                    (_grpc_input("A", "FP32", [4]), raw("FP32", [1, 2, 3, 4])),
                    (_grpc_input("B", "FP32", [4]), raw("FP32", [1, 1, 1, 1])),
                ],
            ),
        ),
    ]
    failing = [grpc_infer("failing", [(_grpc_input("CODE", "INT32", [1]), raw("INT32", [c]))], id=f"s{c}")
               for c in (0, 4, 99)]  # fmt: skip
    cases += [
        GrpcCase("stream/good", "ModelStreamInfer", [grpc_infer("add_sub", add(), id="a"), class_request]),
        GrpcCase("stream/errors", "ModelStreamInfer", failing),
        GrpcCase(
            "stream/bad_requests",
            "ModelStreamInfer",
            [
                grpc_infer("nope", [(_grpc_input("IN", "FP32", [1]), raw("FP32", [1]))], id="x"),
                grpc_infer("identity", [], id="y"),
                grpc_infer("identity", [(_grpc_input("IN_FP32", "FP32", [1, 3]), fp32)], id="z"),
            ],
        ),  # fmt: skip
    ]
    objects = grpc_infer("objects", [(_grpc_input("IN", "FP32", [1]), raw("FP32", [1.0]))])
    cases.append(GrpcCase("infer/objects", "ModelInfer", objects))  # BYTES outputs not built of bytes
    for case_id, key, value in [("triton_parameter", "triton_x", {"int64_param": 1}),
                                ("empty_final", "triton_enable_empty_final_response", {"bool_param": True}),
                                ("empty_final_not_bool", "triton_enable_empty_final_response",
                                 {"string_param": "yes"})]:  # fmt: skip
        message = grpc_infer("asked", [(_grpc_input("IN", "FP32", [1]), raw("FP32", [1.0]))])
        message.parameters[key].CopyFrom(service_pb2.InferParameter(**value))
        cases.append(GrpcCase(f"infer/{case_id}", "ModelInfer", message))
    for code in (0, 1, 2, 3, 4, 5, 6, 7, 8, 99):
        cases.append(
            GrpcCase(
                f"failing/{code}",
                "ModelInfer",
                grpc_infer("failing", [(_grpc_input("CODE", "INT32", [1]), raw("INT32", [code]))]),
            )
        )
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    return cases
