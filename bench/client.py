"""The kubelet's side of one plugin socket: unary calls through the generated stub, and a ListAndWatch
consumer thread that timestamps each list the moment it arrives (kept as raw bytes; parse after timing)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from bench.payloads import allocate_request, preferred_request
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

__all__ = ["ListWatcher", "PluginClient", "timed_calls"]

#: The kubelet raises gRPC's 4 MiB default for device lists; so do we.
_MAX_MESSAGE = 64 * 1024 * 1024


class PluginClient:
    """A synchronous channel to a plugin socket, like the kubelet's one connection per plugin."""

    def __init__(self, sock: Path) -> None:
        self.socket = sock
        self.channel = grpc.insecure_channel(
            f"unix:{sock}", options=[("grpc.max_receive_message_length", _MAX_MESSAGE)]
        )
        self.stub = dp_grpc.DevicePluginStub(self.channel)

    def options(self, timeout: float = 10.0) -> dp.DevicePluginOptions:
        result: dp.DevicePluginOptions = self.stub.GetDevicePluginOptions(
            dp.Empty(), timeout=timeout, wait_for_ready=True
        )
        return result

    def allocate(self, request: dp.AllocateRequest, timeout: float = 30.0) -> dp.AllocateResponse:
        result: dp.AllocateResponse = self.stub.Allocate(request, timeout=timeout)
        return result

    def allocate_ids(self, ids: Sequence[str]) -> dp.AllocateResponse:
        return self.allocate(allocate_request(ids))

    def preferred(
        self, request: dp.PreferredAllocationRequest, timeout: float = 30.0
    ) -> dp.PreferredAllocationResponse:
        result: dp.PreferredAllocationResponse = self.stub.GetPreferredAllocation(request, timeout=timeout)
        return result

    def preferred_ids(self, available: Sequence[str], size: int) -> dp.PreferredAllocationResponse:
        return self.preferred(preferred_request(available, size))

    def deallocate(self, ids: Sequence[str], timeout: float = 60.0) -> None:
        """The KEP's Deallocate (the benchmark's way to free devices between measured calls)."""
        self.stub.Deallocate(dp.DeallocateRequest(devices_ids=list(ids)), timeout=timeout)

    def watch(self) -> ListWatcher:
        return ListWatcher(self.channel)

    def close(self) -> None:
        self.channel.close()


def timed_calls(call: Callable[[Any], object], requests: Sequence[Any]) -> list[int]:
    """Call ``call`` with each request in turn; the round trips in nanoseconds."""
    samples = []
    clock = time.perf_counter_ns
    for request in requests:
        start = clock()
        call(request)
        samples.append(clock() - start)
    return samples


class ListWatcher:
    """Holds one ListAndWatch stream open in a thread; every list arrives with its perf_counter_ns time."""

    def __init__(self, channel: grpc.Channel) -> None:
        method = channel.unary_stream(
            "/v1beta1.DevicePlugin/ListAndWatch",
            request_serializer=dp.Empty.SerializeToString,
            response_deserializer=None,
        )
        self._call: Any = method(dp.Empty())
        self._cond = threading.Condition()
        self.count = 0
        self.latest: tuple[int, bytes] | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="list-watcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for data in self._call:
                now = time.perf_counter_ns()
                with self._cond:
                    self.count += 1
                    self.latest = (now, data)
                    self._cond.notify_all()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.error = exc
        finally:
            with self._cond:
                self._cond.notify_all()

    def wait(self, after: int, timeout: float = 10.0) -> tuple[int, int, bytes]:
        """Wait for a list newer than number ``after``; returns (its number, arrival ns, bytes)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.count <= after:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    raise TimeoutError(f"no device list after #{after} within {timeout:g} s ({self.error})")
                self._cond.wait(left)
            assert self.latest is not None
            return self.count, self.latest[0], self.latest[1]

    def wait_until(self, predicate: Callable[[bytes], bool], after: int, timeout: float = 10.0) -> tuple[int, int]:
        """The first list after number ``after`` that satisfies ``predicate``: (its number, arrival ns).

        Every list in between is checked (they are kept only as the latest, so
        a burst may skip some; the predicate sees the newest).
        """
        deadline = time.monotonic() + timeout
        number = after
        while True:
            number, arrived, data = self.wait(number, max(0.001, deadline - time.monotonic()))
            if predicate(data):
                return number, arrived

    def settle(self, quiet: float = 0.03, timeout: float = 5.0) -> int:
        """Wait until no list has arrived for ``quiet`` seconds (bounded by ``timeout``); the list count."""
        deadline = time.monotonic() + timeout
        count = self.count
        while time.monotonic() < deadline:
            try:
                count, _, _ = self.wait(count, quiet)
            except TimeoutError:
                break
        return count

    def close(self) -> None:
        self._call.cancel()
        self._thread.join(5)


def device_health(data: bytes, device_id: str) -> str | None:
    """The health of ``device_id`` in a serialized ListAndWatchResponse (None when absent)."""
    for dev in dp.ListAndWatchResponse.FromString(data).devices:
        if device_id == dev.ID:
            return str(dev.health)
    return None
