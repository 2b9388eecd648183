"""naiad.queue_policy (Triton's priority levels and queue policies) and naiad.reply_order
(preserve_ordering on the client side of the queue), without servers."""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from naiad import keys, queue_policy
from naiad.errors import ConfigError
from naiad.reply_order import ReplyOrder

LEVELS = """
max_batch_size: 8
dynamic_batching {
  priority_levels: 3 default_priority_level: 2
  default_queue_policy { max_queue_size: 5 default_timeout_microseconds: 2000000 }
  priority_queue_policy { key: 1 value: { timeout_action: DELAY default_timeout_microseconds: 1000 } }
  priority_queue_policy {
    key: 3 value: { allow_timeout_override: true default_timeout_microseconds: 500000 }
  }
}
"""


def config(text: str) -> mc.ModelConfig:
    return text_format.Parse('name: "m" ' + text, mc.ModelConfig())


def test_streams_per_level():
    assert keys.request_stream("m") == keys.request_stream("m", 1) == "naiad:{m}:requests"
    assert keys.request_stream("m", 3) == "naiad:{m}:requests:3"
    assert keys.request_streams("m", 0) == ["naiad:{m}:requests"]
    assert queue_policy.streams("m", config(LEVELS)) == [
        "naiad:{m}:requests", "naiad:{m}:requests:2", "naiad:{m}:requests:3"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("priority", "level"),
    [(None, 2), (0, 2), (1, 1), (3, 3), (4, 2), (2**64 - 1, 2), ("1", 2), (True, 2)],
)
def test_level_of_clamps_like_triton(priority, level):
    """core InferenceRequest::SetPriority: 0 or above priority_levels is the default level."""
    assert queue_policy.level_of(config(LEVELS), priority) == level


def test_single_queue_is_level_zero():
    assert queue_policy.level_of(config("max_batch_size: 8 dynamic_batching { }"), 5) == 0
    assert queue_policy.level_of(config("max_batch_size: 8"), 1) == 0
    assert queue_policy.priority_levels(config("max_batch_size: 8")) == 0


@pytest.mark.parametrize(
    ("default_us", "allowed", "requested", "expected"),
    [
        (0, False, None, 0),
        (1000, False, 10, 1000),  # not allowed: the request's timeout is ignored
        (1000, True, 10, 10),  # allowed: it may shorten it
        (1000, True, 5000, 1000),  # never lengthen it
        (1000, True, 0, 1000),  # 0: none of its own
        (0, True, 10, 0),  # no default timeout: none (Triton's rule, override < 0 never holds)
    ],
)
def test_queue_timeout_override(default_us, allowed, requested, expected):
    policy = mc.ModelQueuePolicy(default_timeout_microseconds=default_us, allow_timeout_override=allowed)
    assert queue_policy.queue_timeout_us(policy, requested) == expected


def test_place():
    cfg = config(LEVELS)
    default = queue_policy.place("m", cfg, {}, server_max_queue=100)
    assert default == queue_policy.Placement(2, "naiad:{m}:requests:2", 5, 2.0, True, False, batch=8)
    high = queue_policy.place("m", cfg, {"priority": 1}, 100)
    assert (high.level, high.stream, high.max_queue, high.timeout_s, high.reject) == (
        1, "naiad:{m}:requests", 100, 0.001, False
    )  # fmt: skip
    low = queue_policy.place("m", cfg, {"priority": 3, "timeout": 1000}, 100)
    assert (low.timeout_s, low.max_queue) == (0.001, 100)
    plain = queue_policy.place("m", config("max_batch_size: 0"), {"priority": 7}, 100)
    assert plain == queue_policy.Placement(0, "naiad:{m}:requests", 100, 0.0, True, False)
    ordered = config("max_batch_size: 4 dynamic_batching { preserve_ordering: true }")
    assert queue_policy.place("m", ordered, {}).ordered


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("max_batch_size: 4 dynamic_batching { preferred_batch_size: [8] }", "preferred size 8"),
        ("max_batch_size: 4 dynamic_batching { preferred_batch_size: [0] }", "preferred size 0"),
        ("max_batch_size: 4 dynamic_batching { priority_levels: 2 }", "default priority level"),
        ("max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
         "default priority level"),
        ("max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 1 "
         "priority_queue_policy { key: 3 value: { } } }", "priority queue policy"),
        ("max_batch_size: 4 dynamic_batching { priority_levels: 17 default_priority_level: 1 }",
         "at most 16"),
        ("max_batch_size: 4 dynamic_batching { preserve_ordering: true priority_levels: 2 "
         "default_priority_level: 1 }", "Only one priority level"),
        ("max_batch_size: 4 dynamic_batching { preserve_ordering: true default_queue_policy "
         "{ timeout_action: DELAY default_timeout_microseconds: 5 } }", "DELAY"),
    ],
)
def test_check_config_refuses_what_triton_refuses(text, match):
    with pytest.raises(ConfigError, match=match):
        queue_policy.check_config(config(text))


def test_check_config_accepts():
    queue_policy.check_config(config(LEVELS))
    queue_policy.check_config(config("max_batch_size: 0"))
    queue_policy.check_config(config("max_batch_size: 4 dynamic_batching { preserve_ordering: true "
                                     "default_queue_policy { timeout_action: DELAY } }"))  # fmt: skip


def test_reply_order_releases_in_entry_order():
    async def main() -> list[str]:
        order, released = ReplyOrder(), []
        first, second, third = (order.open("s") for _ in range(3))
        order.place(second, b"5-1")
        order.place(third, b"6-0")

        async def answer(name, slot):
            await order.turn("s", slot)
            released.append(name)
            order.close("s", slot)

        late = [asyncio.create_task(answer("third", third)), asyncio.create_task(answer("second", second))]
        await asyncio.sleep(0.01)
        assert released == []  # the first has no id yet: it may still come before them
        order.place(first, b"5-0")
        await asyncio.sleep(0.01)
        assert released == []  # it did: both wait for its answer
        await answer("first", first)
        await asyncio.gather(*late)
        return released

    assert asyncio.run(main()) == ["first", "second", "third"]


def test_reply_order_skips_requests_that_never_entered_the_queue():
    async def main() -> None:
        order = ReplyOrder()
        refused, mine = order.open("s"), order.open("s")
        order.place(mine, b"9-0")
        order.close("s", refused)  # its XADD failed (a full queue): nothing to wait for
        await asyncio.wait_for(order.turn("s", mine), 1)
        order.close("s", mine)
        assert not order._slots  # noqa: SLF001 - nothing kept

    asyncio.run(main())
