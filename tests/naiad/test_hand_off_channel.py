"""Direct hand-off (naiad.reply_channel): a gateway's request goes to an idle worker on its
machine by the reply socket instead of Redis, and back to Redis whenever that worker cannot
answer it. Real parts: a private redis-server, the gateway's QueueDispatcher and ReplyServer,
the worker's QueueReader, ReplySender and ReplyConnections, the codec; the "worker" is this
test answering what it is handed with known outputs."""

from __future__ import annotations

import asyncio
import socket
import time

import numpy as np
import pytest

from naiad import keys, reply_channel
from naiad.codec import DATA, HEADER, Reply, decode_request, encode_reply
from naiad.errors import DeadlineExceeded
from naiad.inference import InferRequest, RequestedOutput, Tensor
from naiad.queue_client import QueueDispatcher
from naiad.redis_client import connect
from naiad.reply_channel import FRAME, OFFER, REQUEST, GatewayLink, ReplyConnections, ReplyServer
from workers.queue_reader import QueueReader
from workers.replies import ReplySender

MODEL = "handoff"


class _Loader:
    """What ReplySender asks a loader for: nothing pulled or loaded since the last batch."""

    def take_pulls(self):
        return []

    def take_loads(self):
        return []


def request(value: float, version: int = 1) -> InferRequest:
    data = np.full((1, 4), value, np.float32)
    return InferRequest(MODEL, version, [Tensor("x", "FP32", [1, 4], data)], outputs=[RequestedOutput("y")])


def answer(queued) -> bytes:
    """The 'model': y = 2 x, as a worker encodes its reply."""
    (x,) = queued.request.inputs
    return encode_reply(Reply(queued.queue_id, [Tensor("y", "FP32", list(x.shape), x.data * 2)]))


class Gateway:
    """A gateway's queue client with its reply socket handing requests off."""

    def __init__(self, redis_url: str):
        self.redis = connect(redis_url)
        self.dispatcher = QueueDispatcher(self.redis, connect(redis_url, longest_block_s=6))
        self.server = ReplyServer(self.dispatcher.deliver, self.dispatcher.record_executions,
                                  self.dispatcher.orphaned)  # fmt: skip

    async def __aenter__(self) -> Gateway:
        await self.server.start()
        self.dispatcher.reply_address = self.server.address
        self.dispatcher.direct = self.server
        await self.dispatcher.start()
        await self.redis.delete(keys.request_stream(MODEL), keys.workers(MODEL))
        return self

    async def __aexit__(self, *exc) -> None:
        await self.dispatcher.stop()
        await self.server.close()
        await self.dispatcher.reader.aclose()
        await self.redis.aclose()


class Worker:
    """A worker's queue reader and reply sender; what is handed to it lands in ``handed``."""

    def __init__(self, redis, worker_id: str = "w1", versions=(1,)):
        self.reader = QueueReader(redis, MODEL, worker_id)
        self.sender = ReplySender(redis, MODEL, self.reader, _Loader())
        self.handed: asyncio.Queue = asyncio.Queue()
        self.sender.direct.on_request = lambda level, h, d: self.handed.put_nowait(
            decode_request(MODEL, {HEADER: h, DATA: d}))
        self.sender.direct.offer = (MODEL, list(versions))

    async def serve_from_redis(self, offer: bool = True) -> None:
        """Claim one request from the stream and answer it (the reply offers the next)."""
        (queued,) = await self.reader.read(1, 5000)
        await self.sender.send([(queued, answer(queued))], offer=offer)

    async def connect(self, gw: Gateway, offer: bool = True) -> None:
        """The first request goes through the stream (no worker has offered yet); its answer
        goes by the socket, which opens this worker's connection (with ``offer``, its offer)."""
        await self.reader.ensure_groups()
        first = asyncio.create_task(gw.dispatcher.infer(request(1.0), 5))
        await self.serve_from_redis(offer=offer)
        assert outputs(await first) == [2.0] * 4

    async def serve_handed(self, offer: bool = True):
        queued = await asyncio.wait_for(self.handed.get(), 5)
        await self.sender.send([(queued, answer(queued))], offer=offer)
        return queued


async def until(condition, what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def offering(gw: Gateway, count: int):
    """A worker connected to ``gw`` with an open offer of ``count`` requests; its link there."""
    worker = Worker(gw.redis)
    worker.sender.direct.offer_count = count
    await worker.connect(gw)
    await until(lambda: gw.server._offers.get(MODEL), "the offer")
    (link,) = gw.server._offers[MODEL]
    return worker, link


def outputs(response) -> list[float]:
    return response.outputs[0].data.ravel().tolist()


def test_an_idle_worker_is_handed_the_next_request_and_redis_carries_none_of_it(redis_url):
    """The first request goes through the stream (no worker has offered); its reply carries
    the worker's offer, so the next request goes down the socket: the stream stays empty and
    the answer is the worker's. The offer is one request: the third goes through Redis
    again when the second's reply carried no new offer."""

    async def scenario():
        async with Gateway(redis_url) as gw:
            worker = Worker(gw.redis)
            stream = keys.request_stream(MODEL)
            await worker.connect(gw)
            await until(lambda: gw.server._offers.get(MODEL), "the offer")
            second = asyncio.create_task(gw.dispatcher.infer(request(3.0), 5))
            handed = await worker.serve_handed(offer=False)
            assert outputs(await second) == [6.0] * 4 and handed.entry_id == b""
            assert await gw.redis.xlen(stream) == 0
            third = asyncio.create_task(gw.dispatcher.infer(request(4.0), 5))
            await until(lambda: gw.server._offers.get(MODEL) == [], "no offer", 1)
            await worker.serve_from_redis(offer=False)
            assert outputs(await third) == [8.0] * 4
            worker.sender.direct.close()

    asyncio.run(scenario())


def test_a_handed_request_goes_through_redis_when_its_worker_goes_away_or_its_heartbeat_lapses(redis_url):
    """The worker's connection closes with a handed request unanswered (it exited or was
    killed): the gateway queues that request in the stream, where another worker answers
    it. A worker that keeps its connection open but whose heartbeat lapsed (frozen, hung)
    loses a handed request the same way after the liveness period; one with a current
    heartbeat keeps it."""

    async def scenario():
        async with Gateway(redis_url) as gw:
            gw.dispatcher.liveness_s = 0.2
            stream = keys.request_stream(MODEL)
            dying = Worker(gw.redis, "dying")
            await dying.connect(gw)
            await until(lambda: gw.server._offers.get(MODEL), "the offer")
            live = time.time() + 60
            await gw.redis.zadd(keys.workers(MODEL), {"dying": live})
            lost = asyncio.create_task(gw.dispatcher.infer(request(5.0), 10))
            await asyncio.wait_for(dying.handed.get(), 5)  # handed, never answered
            await asyncio.sleep(0.5)  # past the liveness period: its heartbeat is current
            assert await gw.redis.xlen(stream) == 0 and not lost.done()
            dying.sender.direct.close()  # the worker is gone
            other = Worker(gw.redis, "other")
            await other.serve_from_redis()
            assert outputs(await lost) == [10.0] * 4

            await until(lambda: gw.server._offers.get(MODEL), "the other's offer")
            frozen = asyncio.create_task(gw.dispatcher.infer(request(6.0), 10))
            await asyncio.wait_for(other.handed.get(), 5)  # "other" has no heartbeat entry
            await other.serve_from_redis(offer=False)  # queued again after ~0.2 s, answered
            assert outputs(await frozen) == [12.0] * 4
            other.sender.direct.close()

    asyncio.run(scenario())


def test_an_offer_covers_its_versions_and_a_timeout_still_applies(redis_url):
    """A request for a version the worker did not offer goes through Redis; a handed request
    the worker never answers fails with the request's own timeout."""

    async def scenario():
        async with Gateway(redis_url) as gw:
            worker = Worker(gw.redis, versions=(1,))
            await gw.redis.zadd(keys.workers(MODEL), {"w1": time.time() + 60})
            await worker.connect(gw)
            await until(lambda: gw.server._offers.get(MODEL), "the offer")
            v2 = asyncio.create_task(gw.dispatcher.infer(request(2.0, version=2), 5))
            (queued,) = await worker.reader.read(1, 5000)
            assert queued.request.version == 2 and worker.handed.empty()
            await worker.sender.send([(queued, answer(queued))])
            assert outputs(await v2) == [4.0] * 4
            with pytest.raises(DeadlineExceeded):
                await gw.dispatcher.infer(request(3.0), 0.3)
            assert not worker.handed.empty()  # it was handed, and not answered in time
            worker.sender.direct.close()

    asyncio.run(scenario())


def test_a_malformed_or_foreign_offer_closes_the_connection(redis_url):
    """After its token, a peer that sends an offer that is not [model, versions, count,
    worker] (or offers more than MAX_OFFER, or another model than it offered before) is
    disconnected and holds no offer."""

    async def scenario():
        server = ReplyServer(lambda replies: None, lambda model, run: None, lambda queue_id: None)
        await server.start()
        token = server.token.encode()
        closed = []
        for offers in ([["m", [1], 1]], [["m", [1], reply_channel.MAX_OFFER + 1, "w"]],
                       [["m", [1], 1, "w"], ["n", [1], 1, "w"]], [["m", ["1"], 1, "w"]]):  # fmt: skip
            reader, writer = await asyncio.open_unix_connection(server.path)
            frames = FRAME.pack(0, len(token)) + token
            for offer in offers:
                raw = reply_channel.msgpack.packb(offer)
                frames += FRAME.pack(OFFER, len(raw)) + raw
            writer.write(frames)
            closed.append(await asyncio.wait_for(reader.read(), 2))
            writer.close()
        held = server.take("m", 1)
        await server.close()
        return closed, held

    closed, held = asyncio.run(scenario())
    assert closed == [b""] * 4 and held is None


def test_no_hand_off_while_this_gateway_has_requests_of_the_model_in_the_stream(redis_url):
    """With an offer open, a request still goes through the stream while another request of
    the same model from this gateway is there (a handed one would overtake it, and run as a
    batch of its own beside the stream's); once none is, the next are handed, one beside
    another, while the offer (a batch: ``offer_count``) lasts."""

    async def scenario():
        async with Gateway(redis_url) as gw:
            worker = Worker(gw.redis)
            worker.sender.direct.offer_count = 4
            await worker.connect(gw, offer=False)
            waiting = asyncio.create_task(gw.dispatcher.infer(request(2.0), 5))
            await until(lambda: gw.dispatcher._in_stream.get(MODEL), "the first queued")
            worker.sender.direct.offer_all()
            await until(lambda: gw.server._offers.get(MODEL), "the offer")
            behind = asyncio.create_task(gw.dispatcher.infer(request(3.0), 5))
            await until(lambda: gw.dispatcher._in_stream.get(MODEL) == 2, "the second queued")
            assert worker.handed.empty() and gw.server._offers.get(MODEL)  # the offer still open
            for _ in range(2):
                await worker.serve_from_redis(offer=False)
            assert [outputs(await t)[0] for t in (waiting, behind)] == [4.0, 6.0]
            assert not gw.dispatcher._in_stream[MODEL]
            first = asyncio.create_task(gw.dispatcher.infer(request(5.0), 5))
            one = await asyncio.wait_for(worker.handed.get(), 5)
            second = asyncio.create_task(gw.dispatcher.infer(request(4.0), 5))  # the first in flight
            two = await asyncio.wait_for(worker.handed.get(), 5)
            (link,) = gw.server._offers[MODEL]
            (own,) = worker.sender.direct._links.values()
            assert link.offered == own.offered == 2  # the offer's rest, on both sides
            await worker.sender.send([(q, answer(q)) for q in (one, two)], offer=False)
            assert [outputs(await t)[0] for t in (first, second)] == [10.0, 8.0]
            assert await gw.redis.xlen(keys.request_stream(MODEL)) == 0
            worker.sender.direct.close()

    asyncio.run(scenario())


def test_a_busy_worker_is_not_handed_more_while_another_waits_idle(redis_url):
    """Two workers offer; the one that offered last is handed a request and runs it: the
    next request goes to the other, idle one (its offer whole), not behind the running one."""

    async def scenario():
        async with Gateway(redis_url) as gw:
            idle, busy = Worker(gw.redis, "idle"), Worker(gw.redis, "busy")
            for worker in (idle, busy):
                worker.sender.direct.offer_count = 4
                await worker.connect(gw, offer=False)
            for count, worker in enumerate((idle, busy), 1):
                worker.sender.direct.offer_all()
                await until(lambda c=count: len(gw.server._offers.get(MODEL, [])) == c, "the offers")
            first = asyncio.create_task(gw.dispatcher.infer(request(1.0), 5))
            running = await asyncio.wait_for(busy.handed.get(), 5)
            second = asyncio.create_task(gw.dispatcher.infer(request(2.0), 5))
            other = await asyncio.wait_for(idle.handed.get(), 5)
            assert busy.handed.empty()
            await idle.sender.send([(other, answer(other))], offer=False)
            await busy.sender.send([(running, answer(running))], offer=False)
            assert [outputs(await t)[0] for t in (first, second)] == [2.0, 4.0]
            for worker in (idle, busy):
                worker.sender.direct.close()

    asyncio.run(scenario())


def test_withdraw_all_reaches_a_gateway_whose_offer_this_worker_thinks_used(redis_url):
    """A write of requests from an older offer can arrive after the worker made a new one,
    so the worker may count an offer used that the gateway holds open: withdrawing (an idle
    exit, a drain) reaches every gateway all the same, and nothing more is handed."""

    async def scenario():
        async with Gateway(redis_url) as gw:
            worker = Worker(gw.redis)
            await worker.connect(gw)
            await until(lambda: gw.server._offers.get(MODEL), "the offer")
            (own,) = worker.sender.direct._links.values()
            own.offered = 0  # as after a late request of an older offer
            worker.sender.direct.withdraw_all()
            await until(lambda: not gw.server._offers.get(MODEL), "the offer withdrawn")
            late = asyncio.create_task(gw.dispatcher.infer(request(3.0), 5))
            await worker.serve_from_redis(offer=False)
            assert outputs(await late)[0] == 6.0 and worker.handed.empty()
            worker.sender.direct.close()

    asyncio.run(scenario())


def test_an_offer_of_a_batch_takes_a_burst_in_two_halves_and_the_rest_goes_through_redis(redis_url):
    """A worker offering four requests: of five made in one loop turn, four go down its
    socket, in two writes of two (a write that carries half the offer goes at once, so the
    worker starts on the first half while the gateway hands the rest), and the one the offer
    does not cover goes through the stream."""

    class Counted:
        """The gateway's end of the socket, counting the requests of each write."""

        def __init__(self, transport):
            self.transport, self.writes = transport, []

        def writelines(self, parts) -> None:
            self.writes.append(len(parts) // 3)  # a request: its frame header, header, data
            self.transport.writelines(parts)

        def __getattr__(self, name):
            return getattr(self.transport, name)

    async def scenario():
        async with Gateway(redis_url) as gw:
            worker, link = await offering(gw, 4)
            link.transport = counted = Counted(link.transport)
            calls = [asyncio.create_task(gw.dispatcher.infer(request(float(i)), 5)) for i in range(5)]
            handed = [await asyncio.wait_for(worker.handed.get(), 5) for _ in range(4)]
            assert counted.writes == [2, 2] and not gw.server._offers.get(MODEL)
            queued = await worker.reader.read(5, 5000)
            assert len(queued) == 1 and worker.handed.empty()
            await worker.sender.send([(q, answer(q)) for q in handed + queued], offer=False)
            assert [outputs(await c)[0] for c in calls] == [0.0, 2.0, 4.0, 6.0, 8.0]
            assert sorted(q.entry_id == b"" for q in handed + queued) == [False, True, True, True, True]
            worker.sender.direct.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("lone", "last_write", "at_once"), [(True, 1, True), (False, 1, False), (True, 5, False)]
)
def test_a_request_alone_in_its_gateway_is_written_at_once_others_wait_for_company(
    redis_url, lone, last_write, at_once
):
    """A request handed while its gateway carries no other (``ReplyServer.lone``, the data
    plane's count) goes down the socket in the loop turn that hands it, as Nagle's algorithm
    sends when nothing is outstanding, unless the link's last write carried several (a
    closed loop's burst returning one by one: those are gathered); otherwise it waits the
    turns that gather the requests arriving with it (naiad.group_commit), so after one turn
    nothing is written yet."""

    async def scenario():
        async with Gateway(redis_url) as gw:
            worker, link = await offering(gw, 8)
            writes = []
            real = link.transport.writelines
            link.transport.writelines = lambda parts: (writes.append(len(parts) // 3), real(parts))
            gw.server.lone, link._last_requests = (lambda: lone), last_write
            call = asyncio.create_task(gw.dispatcher.infer(request(5.0), 5))
            await asyncio.sleep(0)  # the call's first step: it hands the request
            assert writes == ([1] if at_once else [])
            handed = await worker.serve_handed(offer=False)
            assert outputs(await call) == [10.0] * 4 and handed.entry_id == b"" and writes == [1]
            worker.sender.direct.close()

    asyncio.run(scenario())


def test_a_frames_statistics_are_decoded_when_written_and_a_malformed_one_adds_nothing(redis_url, caplog):
    """The queue client queues a frame's statistics as sent (:meth:`QueueDispatcher.record_executions`):
    a reader's flush (StatsWriter) decodes and writes them, so they count in Redis once it
    returns; a malformed frame is logged then and adds nothing, the good one beside it still
    counts."""
    from naiad import stats  # noqa: PLC0415
    from naiad.stats_writer import StatsWriter  # noqa: PLC0415

    run_ = stats.Execution(1, 2, [10, 30], {"compute_infer": 5}, 1000)
    good = reply_channel.encode_executions(MODEL, [run_, run_])
    bad = reply_channel.msgpack.packb([MODEL, [[1, 1, [10], {"compute_infer": "x"}, 5]]])

    async def scenario():
        redis = connect(redis_url)
        await redis.delete(keys.stats(MODEL))
        dispatcher, writer = QueueDispatcher(redis, redis), StatsWriter(redis)
        dispatcher.stats_sink = writer.add
        dispatcher.record_executions(good)
        dispatcher.record_executions(bad)
        queued_only = await redis.hget(keys.stats(MODEL), "1:execution_count")
        decoded_before = "malformed statistics" in caplog.text  # the bad frame not yet decoded
        await writer.flush()
        written = await redis.hgetall(keys.stats(MODEL))
        await redis.aclose()
        return queued_only, decoded_before, written

    queued_only, decoded_before, written = asyncio.run(scenario())
    assert queued_only is None and not decoded_before  # nothing written nor decoded before the flush
    assert int(written[b"1:execution_count"]) == 2 and int(written[b"1:inference_count"]) == 4
    assert "malformed statistics in a reply frame" in caplog.text


@pytest.mark.parametrize(
    "run",
    [
        [True, 1, [10], {"compute_infer": 5}, 5],  # a bool is no count
        [1, -1, [10], {"compute_infer": 5}, 5],  # negative rows
        [1, 1, [reply_channel.MAX_STAT + 1], {}, 5],  # a queue time past the bound
        [1, 1, [10], {"compute_infer": 5.0}, 5],  # a float phase
        [1, 1, [10], {"compile": 5}, 5],  # a phase Triton does not have
        [1, 1, (10,), {}, 5],  # queue times not a list (a msgpack array is one: here a map below)
        [1, 1, {"a": 1}, {}, 5],
        [1, 1, [10], [5], 5],  # phases not a map
        [1, 1, [10], {}],  # a field missing
    ],
)
def test_malformed_statistics_are_refused_with_valueerror(run):
    """A reply frame's statistics decode only when every count is an int in 0..MAX_STAT
    and every phase one of Triton's; anything else is one ValueError (logged, dropped)."""
    raw = reply_channel.msgpack.packb([MODEL, [run]])
    if run[2] == (10,):  # msgpack writes a tuple as an array: the decoder sees a list, valid
        assert reply_channel.decode_executions(raw)[1][0].queue_ns == [10]
        return
    with pytest.raises(ValueError, match="malformed statistics in a reply frame"):
        reply_channel.decode_executions(raw)


def test_statistics_round_trip_as_encoded():
    from naiad import stats  # noqa: PLC0415

    phases = {"compute_input": 1, "compute_output": 0}
    runs = [stats.Execution(2, 3, [0, 7, reply_channel.MAX_STAT], phases, 9)]
    model, decoded = reply_channel.decode_executions(reply_channel.encode_executions(MODEL, runs))
    assert model == MODEL and decoded == runs
    with pytest.raises(ValueError):
        reply_channel.decode_executions(reply_channel.msgpack.packb([7, []]))  # a model name not a string


def test_a_workers_link_hands_each_request_of_a_read_then_says_the_read_is_done():
    """The worker's end of a gateway's socket (GatewayLink): every whole request frame of
    one read goes to ``on_request``, then ``on_read`` once (the worker batches what came
    together, and answers a lone request at once: workers.worker); a frame cut by the read
    waits for its rest, and a read that completes none says nothing."""

    async def scenario():
        events: list[tuple] = []
        owner = ReplyConnections(on_request=lambda level, header, data: events.append((level, header, data)))
        owner.on_read = lambda: events.append(("read",))
        ours, theirs = socket.socketpair()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_accepted_socket(lambda: GatewayLink(owner), ours)
        frames = [REQUEST.pack(level, 2, 3) + b"h%d" % level + b"d%02d" % level for level in range(3)]
        theirs.sendall(frames[0] + frames[1] + frames[2][:5])
        await until(lambda: len(events) == 3, "the first read")
        assert events == [(0, b"h0", b"d00"), (1, b"h1", b"d01"), ("read",)]
        theirs.sendall(frames[2][5:9])
        await asyncio.sleep(0.05)
        assert len(events) == 3  # still a part of a frame: nothing handed, nothing said
        theirs.sendall(frames[2][9:])
        await until(lambda: len(events) == 5, "the rest of the third frame")
        assert events[3:] == [(2, b"h2", b"d02"), ("read",)]
        transport.close()
        theirs.close()

    asyncio.run(scenario())
