"""Hardening, wire input (issue 9): what any client of a plugin socket can send.

Held before the issue (kept so they stay held): unknown, unhealthy and
duplicate IDs, oversized messages, garbage bytes, 200 concurrent connections.
Fixed by it: error text and logs bounded and escaped (item 7), IDs no kubelet
sends refused (item 7), another client's ListAndWatch stream ending is no
kubelet restart (item 2), GetPreferredAllocation answers within what the
kubelet offered and never more than it asked (item 9).
"""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.text.logsafe import MESSAGE_BYTES
from devplug_mock import read_calls

if TYPE_CHECKING:
    from tests.hardening.conftest import Bench

RESOURCE = "example.com/mock"
#: Longer than any line the daemon logs about a refused request (its message is cut to MESSAGE_BYTES).
LONGEST_LOG_LINE = MESSAGE_BYTES + 200


def _allocate(*ids: str) -> dp.AllocateRequest:
    return dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=list(ids))])


def _preferred(available: list[str], must_include: list[str], size: int) -> dp.PreferredAllocationRequest:
    return dp.PreferredAllocationRequest(
        container_requests=[
            dp.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size
            )
        ]
    )


def _hooks(bench: Bench, hook: str) -> list[dict[str, Any]]:
    return [c for c in read_calls(bench.root / "mock") if c["hook"] == hook]


def _still_serves(bench: Bench) -> None:
    answer = bench.call("Allocate", _allocate("mock3"), dp.AllocateResponse)
    assert answer.container_responses[0].envs["MOCK_DEVICES"] == "mock3"


# --- held before the issue


def test_unknown_unhealthy_and_duplicate_ids_are_refused_naming_them(bench: Bench) -> None:
    bench.start()
    (bench.root / "mock" / "mock1").write_text("unhealthy\n")
    bench.wait(lambda: "mock1" in str(bench.resource_status()["devices"]), "mock1 in the status")
    error = bench.refused("Allocate", _allocate("mock0", "mock0", "nope", "mock1"), dp.AllocateResponse)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = error.details() or ""
    assert "unknown device IDs: nope" in details
    assert "duplicate device IDs: mock0" in details
    assert "nothing was allocated" in details
    assert _hooks(bench, "allocate") == []


def test_an_oversized_message_is_refused_and_the_daemon_keeps_serving(bench: Bench) -> None:
    bench.start()
    error = bench.refused("Allocate", _allocate("x" * (5 * 1024 * 1024)), dp.AllocateResponse)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    _still_serves(bench)


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00" * 4096,
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 512,
        bytes(range(256)) * 64,
    ],
    ids=["zeros", "http1", "http2-preface-then-junk", "every-byte"],
)
def test_garbage_bytes_on_the_socket_harm_nothing(bench: Bench, garbage: bytes) -> None:
    bench.start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.settimeout(10)
        raw.connect(str(bench.socket()))
        raw.sendall(garbage)
    _still_serves(bench)


def test_200_concurrent_connections_are_all_served(bench: Bench) -> None:
    bench.start()
    idle = []
    try:
        for _ in range(200):  # connections that never speak
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            raw.connect(str(bench.socket()))
            idle.append(raw)

        def options(_: int) -> bool:
            answer = bench.call("GetDevicePluginOptions", dp.Empty(), dp.DevicePluginOptions)
            return bool(answer.pre_start_required)

        with ThreadPoolExecutor(max_workers=50) as pool:
            assert all(pool.map(options, range(200)))
    finally:
        for raw in idle:
            raw.close()
    _still_serves(bench)


# --- item 7: bounded and escaped


def test_100k_unknown_ids_get_invalid_argument_with_a_bounded_message(bench: Bench) -> None:
    bench.start()
    ids = [f"x{i}" for i in range(100_000)]
    error = bench.refused("Allocate", _allocate(*ids), dp.AllocateResponse)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    details = error.details() or ""
    assert "unknown device IDs: x0, x1, x2" in details
    assert "and 99990 more" in details
    assert len(details.encode()) <= MESSAGE_BYTES
    bench.wait(lambda: "and 99990 more" in bench.log(), "the refusal in the log")
    assert max(len(line) for line in bench.log().splitlines()) <= LONGEST_LOG_LINE
    _still_serves(bench)


def test_a_device_id_with_a_newline_cannot_forge_a_log_line(bench: Bench) -> None:
    bench.start()
    forged = "07:00:00.000 ERROR x: FORGED"
    error = bench.refused("Allocate", _allocate("mock0\n" + forged), dp.AllocateResponse)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed device IDs" in (error.details() or "")
    bench.wait(lambda: "FORGED" in bench.log(), "the refusal in the log")
    lines = [line for line in bench.log().splitlines() if "FORGED" in line]
    assert lines and all("mock0\\n07:00:00.000" in line for line in lines), lines
    assert not any(line.startswith(forged) for line in bench.log().splitlines())


@pytest.mark.parametrize(
    ("device_id", "why"),
    [
        ("mock0\x1b[2J", "control characters"),
        ("mock 0", "whitespace"),
        ("", "non-empty"),
        ("m" * 257, "257 bytes long"),
    ],
    ids=["terminal-escape", "space", "empty", "too-long"],
)
def test_ids_no_kubelet_sends_are_refused_before_any_hook(bench: Bench, device_id: str, why: str) -> None:
    bench.start()
    for method, request, response in (
        ("Allocate", _allocate("mock0", device_id), dp.AllocateResponse),
        ("PreStartContainer", dp.PreStartContainerRequest(devices_ids=[device_id]), dp.PreStartContainerResponse),
        ("GetPreferredAllocation", _preferred(["mock0", device_id], [], 1), dp.PreferredAllocationResponse),
    ):
        error = bench.refused(method, request, response)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, error.details())
        assert "malformed device IDs" in (error.details() or "") and why in (error.details() or ""), method
    assert read_calls(bench.root / "mock") == []
    assert "\x1b" not in bench.log()


# --- item 2: only the kubelet's own stream ending is a restart sign


def test_another_clients_stream_ending_does_not_reregister(bench: Bench) -> None:
    bench.start()
    registrations = bench.kubelet.registrations(RESOURCE)
    with bench.channel() as channel:
        stream: Any = channel.unary_stream(
            "/v1beta1.DevicePlugin/ListAndWatch",
            request_serializer=dp.Empty.SerializeToString,
            response_deserializer=dp.ListAndWatchResponse.FromString,
        )(dp.Empty())
        assert len(next(stream).devices) == 4
        stream.cancel()
    bench.wait(lambda: "of another client ended; not a kubelet restart" in bench.log(), "the stream's end in the log")
    _still_serves(bench)  # the line above is logged where a re-registration would have been triggered instead
    assert bench.kubelet.registrations(RESOURCE) == registrations
    view = bench.kubelet.resource(RESOURCE)
    assert view is not None and view.stream_open
    assert "re-registering" not in bench.log()


def test_the_kubelets_own_stream_ending_still_reregisters(bench: Bench) -> None:
    bench.start()
    registrations = bench.kubelet.registrations(RESOURCE)
    # A kubelet ends its stream only when it goes away; close the dev kubelet's client alone to see that sign alone.
    client = bench.kubelet.kubelet._resources[RESOURCE].client
    assert client is not None
    bench.kubelet._run(client.close())
    bench.wait(lambda: bench.kubelet.registrations(RESOURCE) > registrations, "a fresh registration")
    assert "re-registering: the kubelet ended the ListAndWatch stream" in bench.log()


# --- item 9: GetPreferredAllocation as the kubelet uses the answer


def test_preferred_allocation_refuses_must_include_outside_available(bench: Bench) -> None:
    bench.start()
    error = bench.refused(
        "GetPreferredAllocation", _preferred(["mock0", "mock1"], ["mock2"], 2), dp.PreferredAllocationResponse
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must_include device IDs not in available: mock2" in (error.details() or "")


def test_preferred_allocation_refuses_more_must_include_than_size(bench: Bench) -> None:
    bench.start()
    error = bench.refused(
        "GetPreferredAllocation",
        _preferred(["mock0", "mock1", "mock2"], ["mock0", "mock1", "mock2"], 2),
        dp.PreferredAllocationResponse,
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "3 must_include device IDs for allocation_size 2" in (error.details() or "")


@pytest.mark.parametrize(("must_include", "size"), [([], 1), (["mock2"], 2), (["mock1", "mock3"], 3), (["mock0"], 1)])
def test_preferred_allocation_answers_at_most_size_ids_within_available(
    bench: Bench, must_include: list[str], size: int
) -> None:
    bench.start()
    available = ["mock0", "mock1", "mock2", "mock3"]
    answer = bench.call(
        "GetPreferredAllocation", _preferred(available, must_include, size), dp.PreferredAllocationResponse
    )
    chosen = list(answer.container_responses[0].deviceIDs)
    assert len(chosen) == size
    assert chosen[: len(must_include)] == must_include
    assert set(chosen) <= set(available) and len(set(chosen)) == len(chosen)
