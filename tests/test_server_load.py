"""Load test of `trl-rm-env serve` (issue 13): 500 concurrent requests, one 7 MB request and 50 slow clients at once.

While the load runs, a probe thread opens a new connection to `GET /health` every 50 ms and times the answer (as a
Kubernetes liveness probe would). Pass: every /health answer under 1 s, the 500 requests all answered 200 with their
exact scores, the 7 MB request refused with 400, every slow client closed by the server (header timeout), nothing
else failing. Loopback only, bounded in count and time (it stops by itself after at most 60 s). Run with `-s` to see
the numbers.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from urllib.parse import urlparse

import pytest

aiohttp = pytest.importorskip("aiohttp", reason="aiohttp is not installed")

from helpers import ServerProcess, conversations  # noqa: E402

N_REQUESTS, N_SLOW, BIG_BYTES, DEADLINE = 500, 50, 7_000_000, 60.0


@pytest.fixture(scope="module")
def server(tiny_dir):
    proc = ServerProcess(str(tiny_dir / "reward_model"), "--header-timeout", "2", "--max-tokens-per-batch", "8192")
    try:
        yield proc.wait()
    finally:
        proc.stop()


class HealthProbe(threading.Thread):
    """GET /health on a fresh connection every `every` seconds until stopped; records each latency (or failure)."""

    def __init__(self, addr: tuple[str, int], every: float = 0.05):
        super().__init__(daemon=True)
        self.addr, self.every = addr, every
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            start = time.monotonic()
            try:
                with socket.create_connection(self.addr, timeout=5) as s:
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
                    head = s.recv(64)
                if not head.startswith(b"HTTP/1.1 200"):
                    self.failures.append(head.decode(errors="replace"))
            except OSError as err:
                self.failures.append(f"{type(err).__name__}: {err}")
            self.latencies.append(time.monotonic() - start)
            self.done.wait(self.every)


async def slow_client(addr: tuple[str, int], i: int) -> float:
    """Send a request head one byte every 0.1 s (even i) or nothing (odd i); return when the server closes it."""
    start = time.monotonic()
    reader, writer = await asyncio.open_connection(*addr)
    head = b"POST /pooling HTTP/1.1\r\nHost: slow\r\nContent-Type: application/json\r\n" * 10
    try:
        for byte in head:
            if i % 2 == 0:
                writer.write(bytes([byte]))
                await writer.drain()
            try:
                if await asyncio.wait_for(reader.read(1), 0.1) == b"":
                    break  # closed by the server
            except TimeoutError:
                continue
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
    return time.monotonic() - start


@pytest.mark.slow
def test_health_stays_fast_under_load_and_only_bad_requests_fail(server, tiny_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from trl_rm_env.scoring.scorer import RewardScorer

    url = server
    addr = (urlparse(url).hostname, urlparse(url).port)
    assert addr[0] == "127.0.0.1"
    pairs = conversations(N_REQUESTS, offset=20_000)
    big = json.dumps({"input": "hello world, " * (BIG_BYTES // 13)})

    async def load():
        connector = aiohttp.TCPConnector(limit=0)  # 500 connections at once
        timeout = aiohttp.ClientTimeout(total=DEADLINE)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

            async def one(context, completion):
                async with session.post(url + "/pooling", json={"messages": [*context, *completion]}) as response:
                    return response.status, await response.json()

            async def big_one():
                headers = {"Content-Type": "application/json"}
                async with session.post(url + "/pooling", data=big, headers=headers) as response:
                    return response.status, await response.json()

            slow = [asyncio.create_task(slow_client(addr, i)) for i in range(N_SLOW)]
            big_task = asyncio.create_task(big_one())
            replies = await asyncio.gather(*(one(c, r) for c, r in pairs))
            return replies, await big_task, await asyncio.gather(*slow)

    probe = HealthProbe(addr)
    probe.start()
    start = time.monotonic()
    try:
        replies, (big_status, big_body), slow_times = asyncio.run(asyncio.wait_for(load(), DEADLINE))
    finally:
        probe.done.set()
        probe.join(10)
    elapsed = time.monotonic() - start

    ok = sum(status == 200 for status, _ in replies)
    failed = [body for status, body in replies if status != 200]
    latencies = sorted(probe.latencies)
    print(
        f"\nload: {N_REQUESTS} requests in {elapsed:.1f} s: {ok} ok, {len(failed)} failed; 7 MB request: "
        f"{big_status}; {N_SLOW} slow clients closed after {min(slow_times):.1f}-{max(slow_times):.1f} s; /health: "
        f"{len(latencies)} probes, max {latencies[-1] * 1000:.0f} ms, median "
        f"{latencies[len(latencies) // 2] * 1000:.0f} ms, {len(probe.failures)} failed"
    )
    assert not probe.failures, probe.failures[:3]
    assert len(latencies) >= 10 and latencies[-1] < 1.0
    assert ok == N_REQUESTS, failed[:3]
    assert big_status == 400 and big_body["error"]["param"] == "input[0]"
    assert all(t < 10 for t in slow_times)  # the 2 s header timeout closed every one of them

    path = tiny_dir / "reward_model"
    local = RewardScorer(
        AutoModelForSequenceClassification.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    )
    expected = local.score([c for c, _ in pairs], [r for _, r in pairs]).tolist()
    got = [body["data"][0]["data"][0] for _, body in replies]
    assert max(abs(g - e) for g, e in zip(got, expected)) < 1e-4
