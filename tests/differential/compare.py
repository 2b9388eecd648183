"""Send one case to a server and reduce the answer to what the suite compares; diff two.

An HTTP answer becomes ``{"status", "content_type", "binary", "content_encoding", "body"}``
(a compressed body decoded first): the body's JSON
(binary outputs decoded into ``data`` lists by their datatype and shape, so a binary and a
JSON answer of the same tensor compare equal), with error messages reduced to ``"<message>"``
unless the case compares their text. A gRPC answer becomes ``{"code", "response"}``: the
message as a dict (proto field names), ``raw_output_contents`` decoded into each output's
``data``. :func:`diff` lists the ``(path, triton, naiad)`` that differ.
"""

from __future__ import annotations

import gzip
import http.client
import json
import zlib
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor

from naiad.datatypes import numpy_dtype
from tests.differential.cases import GrpcCase, HttpCase

TIMEOUT_S = 60.0
MESSAGE = "<message>"


def _values(datatype: str, shape: list[int], data: bytes) -> list[Any]:
    if datatype == "BYTES":
        items = deserialize_bytes_tensor(data) if data else np.array([], dtype=np.object_)
        return [item.decode("utf-8", "replace") for item in items.reshape(-1)]
    return np.frombuffer(data, dtype=numpy_dtype(datatype)).reshape(-1).tolist()


def _decode_binary(head: dict[str, Any], rest: bytes) -> None:
    offset = 0
    for output in head.get("outputs", []):
        size = output.get("parameters", {}).get("binary_data_size")
        if size is None:
            continue
        output["data"] = _values(output["datatype"], output["shape"], rest[offset : offset + size])
        output["binary"] = True
        offset += size


def _flat(output: dict[str, Any]) -> dict[str, Any]:
    data = output.get("data")
    if isinstance(data, list):
        stack, leaves = [data], []
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                stack.extend(reversed(item))
            else:
                leaves.append(item)
        output["data"] = leaves
    return output


def _decoded(headers: http.client.HTTPMessage, body: bytes) -> tuple[str | None, bytes]:
    coding = (headers.get("Content-Encoding") or "").strip().lower() or None
    if coding == "gzip":
        return coding, gzip.decompress(body)
    if coding == "deflate":
        return coding, zlib.decompress(body)
    return coding, body


def http_view(case: HttpCase, status: int, headers: http.client.HTTPMessage, body: bytes) -> dict[str, Any]:
    coding, body = _decoded(headers, body)
    media = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
    header_length = headers.get("Inference-Header-Content-Length")
    view: dict[str, Any] = {
        "status": status,
        "content_type": media or None,
        "binary": header_length is not None,
    }
    parsed: Any = None
    if header_length is not None:
        parsed = json.loads(body[: int(header_length)])
        _decode_binary(parsed, body[int(header_length) :])
    elif body:
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = {"raw": body.decode("utf-8", "replace")}
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str) and not case.message:
        parsed["error"] = MESSAGE
    if isinstance(parsed, dict) and isinstance(parsed.get("outputs"), list):
        parsed["outputs"] = {o.get("name"): _flat(o) for o in parsed["outputs"]}
    view["body"] = parsed
    return view


def send_http(host: str, port: int, case: HttpCase) -> dict[str, Any]:
    connection = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
    try:
        connection.request(case.method, case.path, body=case.body or None, headers=case.headers)
        response = connection.getresponse()
        return http_view(case, response.status, response.headers, response.read())
    finally:
        connection.close()


def _grpc_outputs(response: dict[str, Any], raw: list[bytes]) -> None:
    outputs = response.get("outputs", [])
    for output, data in zip(outputs, raw, strict=False):
        output["data"] = _values(output["datatype"], [int(d) for d in output.get("shape", [])], data)
    response["outputs"] = {o["name"]: o for o in outputs}


def _stream(stub: service_pb2_grpc.GRPCInferenceServiceStub, case: GrpcCase) -> dict[str, Any]:
    """``ModelStreamInfer`` of ``case.message`` (a list of requests): each streamed answer's
    error message (reduced, as over HTTP) or response."""
    answers = []
    for reply in stub.ModelStreamInfer(iter(case.message), timeout=TIMEOUT_S):
        response = json_format.MessageToDict(reply.infer_response, preserving_proto_field_name=True)
        response.pop("raw_output_contents", None)
        _grpc_outputs(response, list(reply.infer_response.raw_output_contents))
        answers.append({"error": MESSAGE if reply.error_message else "", "response": response})
    # Answers come as requests finish, in no set order: matched by their request ids.
    return {"code": "OK", "response": sorted(answers, key=lambda a: a["response"].get("id", ""))}


def send_grpc(stub: service_pb2_grpc.GRPCInferenceServiceStub, case: GrpcCase) -> dict[str, Any]:
    if case.method == "ModelStreamInfer":
        try:
            return _stream(stub, case)
        except grpc.RpcError as exc:
            return {"code": exc.code().name, "response": None}
    try:
        reply = getattr(stub, case.method)(case.message, timeout=TIMEOUT_S)
    except grpc.RpcError as exc:
        return {"code": exc.code().name, "response": None}
    response = json_format.MessageToDict(reply, preserving_proto_field_name=True)
    if case.method == "ModelInfer":
        raw = list(response.pop("raw_output_contents", []) and reply.raw_output_contents)
        _grpc_outputs(response, raw)
    return {"code": "OK", "response": response}


def diff(triton: Any, naiad: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Every ``(path, triton, naiad)`` where the two views differ (dict keys by name, lists
    by position; a path is dotted: ``body.outputs.OUT_FP32.data``)."""
    if isinstance(triton, dict) and isinstance(naiad, dict):
        found = []
        for key in sorted(set(triton) | set(naiad), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in triton or key not in naiad:
                found.append((sub, triton.get(key, "<absent>"), naiad.get(key, "<absent>")))
            else:
                found += diff(triton[key], naiad[key], sub)
        return found
    if isinstance(triton, list) and isinstance(naiad, list) and len(triton) == len(naiad):
        return [
            d for i, (a, b) in enumerate(zip(triton, naiad, strict=True)) for d in diff(a, b, f"{path}[{i}]")
        ]
    if triton == naiad and type(triton) is type(naiad):
        return []
    return [(path, triton, naiad)]
