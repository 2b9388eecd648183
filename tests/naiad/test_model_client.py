"""``naiad.model_client.ModelClient`` against a private redis-server, the test playing the
worker: a valid request is placed on its model's stream with its timeout and answered, and
its success counted; a refused one (bad input, bad scheduling parameter) is never queued nor
counted; a failure of the answer is counted with Triton's reason."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from naiad_harness import run_dispatcher_scenario

from naiad import keys, stats, stats_writer
from naiad.codec import Reply, decode_request, encode_reply
from naiad.errors import DeadlineExceeded, InvalidInput
from naiad.inference import InferRequest, Tensor
from naiad.model_client import ModelClient
from naiad.registry import READY, ModelEntry
from naiad.stats_writer import StatsWriter
from repository_store import parse_config

MODEL = "mc"
STREAM = keys.request_stream(MODEL)
CONFIG = parse_config(
    f'name: "{MODEL}" backend: "onnxruntime" max_batch_size: 4 '
    'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ] '
    'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]',
    MODEL,
)
ENTRY = ModelEntry(MODEL, CONFIG, [1], READY)


def request(value: float, **parameters) -> InferRequest:
    return InferRequest(MODEL, 1, [Tensor("x", "FP32", [1, 1], np.array([[value]], np.float32))],
                        parameters=parameters)  # fmt: skip


async def answer_one(redis) -> float:
    """Claim one entry as a worker would, answer it with its input, return its deadline's
    distance from its enqueue (the timeout the client gave it)."""
    got = await redis.xreadgroup(keys.WORKER_GROUP, "w", {STREAM: ">"}, count=1, block=5000)
    [(_, [(entry_id, fields)])] = got
    queued = decode_request(MODEL, fields, entry_id)
    y = queued.request.inputs[0].data
    await redis.rpush(queued.reply_to, encode_reply(Reply(queued.queue_id, [Tensor("y", "FP32", [1, 1], y)])))
    return queued.deadline - queued.enqueued_at


async def counts(redis) -> dict[str, int]:
    [model] = await stats.read(redis, [(MODEL, [1])])
    inference = model["inference_stats"]
    return {"success": inference["success"]["count"], "fail": inference["fail"]["count"]}


def test_queue_answer_and_count(redis_url: str, monkeypatch) -> None:
    monkeypatch.setattr(stats_writer, "LINGER_S", 30.0)  # wait_recorded hurries the write

    async def scenario(dispatcher, redis) -> None:
        await redis.delete(keys.stats(MODEL))
        client = ModelClient(dispatcher, StatsWriter(redis), request_timeout_s=30)
        sent = request(2.5, timeout=4_000_000)
        pending = asyncio.ensure_future(client.infer(ENTRY, sent, wait_recorded=True))
        timeout_s = await answer_one(redis)
        response = await asyncio.wait_for(pending, 10)
        assert response.outputs[0].data.tolist() == [[2.5]]
        assert timeout_s == pytest.approx(4.0, abs=0.05)  # the request's own timeout, in µs
        assert await counts(redis) == {"success": 1, "fail": 0}

        with pytest.raises(InvalidInput):  # a wrong shape: refused before the queue
            wide = Tensor("x", "FP32", [1, 2], np.zeros((1, 2), np.float32))
            await client.infer(ENTRY, InferRequest(MODEL, 1, [wide]))
        with pytest.raises(InvalidInput, match="parameter 'priority'"):
            await client.infer(ENTRY, request(1.0, priority=-1))
        assert await redis.xlen(STREAM) == 1  # only the answered one was ever queued
        await client.writer.flush()
        assert await counts(redis) == {"success": 1, "fail": 0}  # refusals are not counted

        with pytest.raises(DeadlineExceeded):  # nobody answers: a failure with Triton's reason
            await client.infer(ENTRY, request(3.0), timeout_s=0.2)
        await client.writer.flush()
        assert await counts(redis) == {"success": 1, "fail": 1}

    run_dispatcher_scenario(redis_url, scenario, [STREAM])
