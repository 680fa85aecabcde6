"""The key-hash gate (broker/api/deps.py): unverified keys are hashed on the gate's few threads; many concurrent
requests with one key share a single hash and are never refused for their own parallelism, while distinct guessed
keys beyond the gate's queue are."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from broker.api.auth import InvalidKey
from broker.api.deps import GateFull, HashGate


class SlowVerify:
    """A stand-in for the scrypt verification: slow, counting its calls."""

    def __init__(self, seconds: float = 0.2) -> None:
        self.seconds = seconds
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, key: str) -> str:
        with self._lock:
            self.calls.append(key)
        time.sleep(self.seconds)
        if key.startswith("bad"):
            raise InvalidKey("wrong")
        return f"principal-of-{key}"


def test_a_hundred_concurrent_requests_with_one_key_share_one_hash_and_none_is_refused() -> None:
    gate, verify = HashGate(slots=1, max_waiting=2), SlowVerify()

    async def burst() -> list[str]:
        return await asyncio.gather(*(gate.run("ovs_k_one", verify) for _ in range(100)))

    answers = asyncio.run(burst())
    assert answers == ["principal-of-ovs_k_one"] * 100
    assert verify.calls == ["ovs_k_one"]
    assert gate.pending == 0


def test_a_wrong_key_fails_every_request_sharing_its_hash() -> None:
    gate, verify = HashGate(slots=1, max_waiting=2), SlowVerify()

    async def burst() -> list[BaseException | str]:
        return await asyncio.gather(*(gate.run("bad-key", verify) for _ in range(10)), return_exceptions=True)

    answers = asyncio.run(burst())
    assert all(isinstance(a, InvalidKey) for a in answers)
    assert verify.calls == ["bad-key"]


def test_distinct_guessed_keys_beyond_the_queue_are_refused() -> None:
    gate, verify = HashGate(slots=1, max_waiting=2), SlowVerify(0.1)

    async def burst() -> list[BaseException | str]:
        return await asyncio.gather(*(gate.run(f"guess-{i}", verify) for i in range(6)), return_exceptions=True)

    answers = asyncio.run(burst())
    refused = [a for a in answers if isinstance(a, GateFull)]
    assert len(refused) == 3  # one running, two waiting, the rest refused at once
    assert len(verify.calls) == 3


def test_a_key_verified_after_its_flight_landed_starts_a_new_one() -> None:
    gate, verify = HashGate(slots=1), SlowVerify(0.01)
    assert asyncio.run(gate.run("ovs_k_two", verify)) == "principal-of-ovs_k_two"
    assert asyncio.run(gate.run("ovs_k_two", verify)) == "principal-of-ovs_k_two"
    assert verify.calls == ["ovs_k_two", "ovs_k_two"]  # no stale flight kept


@pytest.mark.parametrize("slots", [1, 2])
def test_the_gate_never_runs_more_hashes_than_its_slots(slots: int) -> None:
    gate = HashGate(slots=slots, max_waiting=50)
    running, peak, lock = 0, 0, threading.Lock()

    def verify(key: str) -> str:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.02)
        with lock:
            running -= 1
        return key

    async def burst() -> list[str]:
        return await asyncio.gather(*(gate.run(f"k{i}", verify) for i in range(20)))

    assert len(asyncio.run(burst())) == 20
    assert peak == slots
