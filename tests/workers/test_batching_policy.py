"""workers.batching (plan, merge, split) and workers.batcher (BatchPolicy), without servers."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as mc

from naiad.codec import QueuedRequest
from naiad.inference import InferRequest, RequestedOutput, Tensor
from workers import batching
from workers.batcher import BatchPolicy


def request(rows: int, width: int = 2, version: int = 1, outputs=(), start: float = 0.0) -> InferRequest:
    data = (np.arange(rows * width, dtype=np.float32) + start).reshape(rows, width)
    return InferRequest(
        "m", version, [Tensor("x", "FP32", [rows, width], data)], [RequestedOutput(o) for o in outputs]
    )


def test_rows_and_key():
    assert batching.rows(request(3)) == 3
    assert batching.rows(InferRequest("m", 1, [Tensor("x", "FP32", [], np.zeros(()))])) == 1
    assert batching.batch_key(request(1)) == batching.batch_key(request(5))
    assert batching.batch_key(request(1)) != batching.batch_key(request(1, width=3))
    assert batching.batch_key(request(1)) != batching.batch_key(request(1, version=2))
    assert batching.batch_key(request(1, outputs=["a"])) != batching.batch_key(request(1))
    assert batching.batch_key(request(1, outputs=["a", "b"])) == batching.batch_key(
        request(1, outputs=["b", "a"])
    )


def test_plan_groups_compatible_in_arrival_order_and_caps_rows():
    requests = [request(2), request(1, width=3), request(2), request(1), request(1, width=3), request(4)]
    assert batching.plan_batches(requests, 5) == [[0, 2, 3], [1, 4], [5]]
    assert batching.plan_batches(requests, 0) == [[i] for i in range(6)]
    assert batching.plan_batches([request(8)], 4) == [[0]]  # never split a request


@given(
    st.lists(st.tuples(st.integers(1, 5), st.sampled_from([2, 3]), st.sampled_from([1, 2])), max_size=20),
    st.integers(1, 8),
)
def test_plan_properties(specs, max_rows):
    requests = [request(r, w, v) for r, w, v in specs]
    plan = batching.plan_batches(requests, max_rows)
    assert sorted(i for batch in plan for i in batch) == list(range(len(requests)))
    for batch in plan:
        assert batch == sorted(batch)
        assert len({batching.batch_key(requests[i]) for i in batch}) == 1
        assert len(batch) == 1 or sum(batching.rows(requests[i]) for i in batch) <= max_rows


def test_merge_and_split_round_trip():
    requests = [request(1, start=0), request(3, start=100), request(2, start=200)]
    merged = batching.merge(requests)
    assert merged["x"].shape == (6, 2)
    parts = batching.split({"y": merged["x"] * 2, "z": merged["x"][:, :1]}, [1, 3, 2])
    for original, part in zip(requests, parts, strict=True):
        np.testing.assert_array_equal(part["y"], original.inputs[0].data * 2)
        np.testing.assert_array_equal(part["z"], original.inputs[0].data[:, :1])
    single = batching.merge([requests[1]])
    assert single["x"] is requests[1].inputs[0].data


def test_merge_uses_input_names_not_positions():
    a = InferRequest(
        "m", 1, [Tensor("a", "FP32", [1], np.array([1.0])), Tensor("b", "FP32", [1], np.array([2.0]))]
    )
    b = InferRequest(
        "m", 1, [Tensor("b", "FP32", [1], np.array([4.0])), Tensor("a", "FP32", [1], np.array([3.0]))]
    )
    merged = batching.merge([a, b])
    np.testing.assert_array_equal(merged["a"], [1.0, 3.0])
    np.testing.assert_array_equal(merged["b"], [2.0, 4.0])


@pytest.mark.parametrize("outputs", [{"y": np.zeros((5, 2))}, {"y": np.zeros(())}, {"y": np.zeros((7,))}])
def test_split_rejects_wrong_rows(outputs):
    with pytest.raises(ValueError):
        batching.split(outputs, [2, 4])


def config(text: str) -> mc.ModelConfig:
    return text_format.Parse('name: "m" ' + text, mc.ModelConfig())


def queued(rows: int) -> QueuedRequest:
    return QueuedRequest("q", request(rows), "r", 0.0, 0.0)


def test_policy_from_config():
    policy = BatchPolicy.from_config(
        config(
            "max_batch_size: 64 dynamic_batching { preferred_batch_size: [8, 16] "
            "max_queue_delay_microseconds: 2000 }"
        )
    )
    assert policy == BatchPolicy(True, 64, 16, 0.002)
    assert (policy.read_count, policy.plan_rows) == (64, 64)
    assert BatchPolicy.from_config(config("max_batch_size: 8 dynamic_batching { }")).target_rows == 8
    assert (
        BatchPolicy.from_config(
            config("max_batch_size: 8 dynamic_batching { preferred_batch_size: [32] }")
        ).target_rows
        == 8
    )
    off = BatchPolicy.from_config(config("max_batch_size: 8"))
    assert not off.enabled and off.read_count == 1 and off.plan_rows == 0
    nobatch = BatchPolicy.from_config(config("max_batch_size: 0 dynamic_batching { }"))
    assert not nobatch.enabled and nobatch.read_count == 1 and nobatch.target_rows == 1


def test_rows_wanted():
    policy = BatchPolicy(True, 64, 16, 0.002)
    assert policy.rows_wanted([]) == 16
    assert policy.rows_wanted([queued(3), queued(4)]) == 9
    assert policy.rows_wanted([queued(16)]) == 0
    assert policy.rows_wanted([queued(10), queued(10)]) == 0
