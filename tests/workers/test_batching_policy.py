"""workers.batching (next_batch, merge, split) and workers.batcher (BatchPolicy, Batcher),
without servers: Triton's preferred-size and delay rules, the queue order of priority levels
and queue policies."""

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
from workers.batcher import Batcher, BatchPolicy


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


def ones(n: int) -> list[InferRequest]:
    return [request(1) for _ in range(n)]


@pytest.mark.parametrize(
    ("sizes", "preferred", "expected"),
    [
        ([1] * 7, (4, 8), 4),  # batcher.md: the largest preferred size that can be formed
        ([1] * 10, (4, 8), 8),
        ([1] * 20, (4, 8), 8),
        ([1] * 3, (4, 8), 3),  # no preferred size in reach, no delay: the largest possible
        ([3, 3, 3], (4, 8), 2),  # none exact: the longest prefix within the largest preferred (6 rows)
        ([2, 2, 5], (4, 8), 2),  # rows 4 is preferred, 9 overflows it
        ([1] * 20, (), 16),  # without preferred sizes: max_batch_size
        ([10, 10], (), 1),  # a request that would overflow max_batch_size ends the batch
        ([16], (4,), 1),  # a request of max_batch_size rows runs alone
    ],
)
def test_next_batch_preferred_sizes(sizes, preferred, expected):
    indices, wait = batching.next_batch([request(n) for n in sizes], [0.0] * len(sizes), 16, preferred)
    assert indices == list(range(expected)) and wait == 0.0


def test_next_batch_waits_out_the_delay_from_the_oldest_request():
    requests = ones(3)
    assert batching.next_batch(requests, [0.0005, 0.0, 0.0], 16, (4, 8), 0.002) == ([], pytest.approx(0.0015))
    # the oldest has waited the delay: everything pending goes, even past the preferred sizes
    assert batching.next_batch(requests, [0.002, 0.0, 0.0], 16, (4, 8), 0.002) == ([0, 1, 2], 0.0)
    assert batching.next_batch(ones(11), [0.003] + [0.0] * 10, 16, (4, 8), 0.002)[0] == list(range(11))
    # a preferred size in reach goes at once
    assert batching.next_batch(ones(5), [0.0] * 5, 16, (4, 8), 0.002) == ([0, 1, 2, 3], 0.0)
    assert batching.next_batch(ones(16), [0.0] * 16, 16, (), 0.002) == (list(range(16)), 0.0)


def test_next_batch_incompatible_requests():
    mixed = [request(1), request(1, width=3), request(1), request(1)]
    ages = [0.0] * 4
    assert batching.next_batch(mixed, ages, 16, (4,), 1.0) == ([0, 2, 3], 0.0)  # passes over, sends now
    assert batching.next_batch(mixed, ages, 16, (4,), 1.0, contiguous=True) == ([0], 0.0)
    assert batching.next_batch(mixed[1:], ages[1:], 16, (4,), 1.0) == ([0], 0.0)
    assert batching.next_batch(mixed, ages, 0, (), 0.0) == ([0], 0.0)  # no batching: one at a time
    assert batching.next_batch([], [], 16, (), 0.5) == ([], 0.5)


@given(
    st.lists(st.tuples(st.integers(1, 5), st.sampled_from([2, 3]), st.sampled_from([1, 2])), min_size=1,
             max_size=20),
    st.integers(1, 8),
    st.lists(st.integers(1, 8), max_size=3),
    st.booleans(),
)
def test_next_batch_properties(specs, max_rows, preferred, contiguous):
    requests = [request(r, w, v) for r, w, v in specs]
    preferred = [p for p in preferred if p <= max_rows]
    indices, wait = batching.next_batch(requests, [0.0] * len(requests), max_rows, preferred, 0.0, contiguous)
    assert wait == 0.0 and indices[0] == 0 and indices == sorted(set(indices))
    assert len({batching.batch_key(requests[i]) for i in indices}) == 1
    assert len(indices) == 1 or sum(batching.rows(requests[i]) for i in indices) <= max_rows
    if contiguous:
        assert indices == list(range(len(indices)))


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


def queued(rows: int, level: int = 0, entry: int = 1, enqueued_at: float = 100.0, **parameters):
    queued = QueuedRequest("q", request(rows), "r", 1e12, enqueued_at, f"{entry}-0".encode(), level=level)
    queued.request.parameters = parameters
    return queued


def test_policy_from_config():
    policy = BatchPolicy.from_config(
        config(
            "max_batch_size: 64 dynamic_batching { preferred_batch_size: [16, 8] "
            "max_queue_delay_microseconds: 2000 }"
        )
    )
    assert policy == BatchPolicy(True, 64, (8, 16), 0.002, False)
    assert policy.window == 128
    assert BatchPolicy.from_config(config("max_batch_size: 8 dynamic_batching { }")).preferred == ()
    ordered = BatchPolicy.from_config(config("max_batch_size: 8 dynamic_batching { preserve_ordering: 1 }"))
    prioritized = BatchPolicy.from_config(
        config("max_batch_size: 8 dynamic_batching { priority_levels: 2 default_priority_level: 1 }")
    )
    assert ordered.contiguous and prioritized.contiguous
    off = BatchPolicy.from_config(config("max_batch_size: 8"))
    assert not off.enabled and off.window == 1
    nobatch = BatchPolicy.from_config(config("max_batch_size: 0 dynamic_batching { }"))
    assert not nobatch.enabled and nobatch.window == 1


PRIORITIES = config(
    "max_batch_size: 8 dynamic_batching { priority_levels: 2 default_priority_level: 2 "
    "priority_queue_policy { key: 1 value: { timeout_action: DELAY default_timeout_microseconds: 1000000 } } "
    "priority_queue_policy { key: 2 value: { default_timeout_microseconds: 1000000 "
    "allow_timeout_override: true } } }"
)


def batcher(config_: mc.ModelConfig = PRIORITIES) -> Batcher:
    return Batcher("m", config_, BatchPolicy.from_config(config_))


def test_batcher_serves_higher_levels_first_then_arrival():
    held = batcher()
    low = [queued(1, level=2, entry=n) for n in (1, 2)]
    high = [queued(1, level=1, entry=n) for n in (3, 4)]
    held.add([*low, *high])
    assert len(held) == 4 and held.room == 12
    batch, wait = held.take(now=100.0)
    assert batch == [*high, *low] and wait == 0.0 and len(held) == 0


def test_batcher_delay_policy_serves_timed_out_requests_after_the_others():
    held = batcher()
    late = queued(1, level=1, entry=1, enqueued_at=90.0)  # its level-1 DELAY timeout (1 s) has passed
    fresh = [queued(1, level=1, entry=2, enqueued_at=100.0), queued(1, level=2, entry=3, enqueued_at=100.0)]
    held.add([late, *fresh])
    assert held.expired(now=100.0) == []  # DELAY keeps it
    batch, _ = held.take(now=100.0)
    assert batch == [fresh[0], late, fresh[1]]  # after its level's, before lower levels


def test_batcher_reject_policy_and_timeout_override():
    held = batcher()
    kept = queued(1, level=2, entry=1, enqueued_at=99.5)  # default 1 s: not yet
    shortened = queued(1, level=2, entry=2, enqueued_at=99.5, timeout=100_000)  # override: 0.1 s
    longer = queued(1, level=2, entry=3, enqueued_at=98.5, timeout=10_000_000)  # may not lengthen it
    held.add([kept, shortened, longer])
    assert held.expired(now=100.0) == [shortened, longer]
    assert held.take(now=100.0)[0] == [kept]


def test_batcher_waits_for_the_delay_or_a_sooner_queue_timeout():
    cfg = config(
        "max_batch_size: 8 dynamic_batching { preferred_batch_size: [4] max_queue_delay_microseconds: 500000 "
        "default_queue_policy { default_timeout_microseconds: 200000 } }"
    )
    held = batcher(cfg)
    held.add([queued(1, enqueued_at=100.0)])
    batch, wait = held.take(now=100.05)
    assert batch == [] and wait == pytest.approx(0.15)  # the queue timeout ends before the delay
    assert held.expired(now=100.25) != [] and len(held) == 0
    held.add([queued(1, enqueued_at=100.0)])
    assert held.take(now=100.05, flush=True)[0] != []  # draining: no waiting


def test_batcher_remove():
    held = batcher()
    a, b = queued(1, level=1, entry=1), queued(1, level=1, entry=2)
    held.add([a, b])
    held.remove([a])
    assert held.take(now=100.0)[0] == [b]
