"""The daemon against a kubelet-side client built without devplug's generated code.

The descriptors below are written from the kubelet's published v1beta1
definitions (official fields only, no KEP extension), in a pool of their own.
If devplug's package, method paths or field numbers drifted, these calls would
fail or decode garbage.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, unknown_fields

from devplug.testing.configs import dev_config, write_toml
from devplug.testing.daemon import DaemonProcess

F = descriptor_pb2.FieldDescriptorProto
STRING, BOOL, INT64, INT32, MSG = F.TYPE_STRING, F.TYPE_BOOL, F.TYPE_INT64, F.TYPE_INT32, F.TYPE_MESSAGE
OPT, REP = F.LABEL_OPTIONAL, F.LABEL_REPEATED

# name -> [(field name, number, type, label, message type)]
OFFICIAL: dict[str, list[tuple[str, int, int, int, str]]] = {
    "Empty": [],
    "DevicePluginOptions": [
        ("pre_start_required", 1, BOOL, OPT, ""),
        ("get_preferred_allocation_available", 2, BOOL, OPT, ""),
    ],
    "RegisterRequest": [
        ("version", 1, STRING, OPT, ""),
        ("endpoint", 2, STRING, OPT, ""),
        ("resource_name", 3, STRING, OPT, ""),
        ("options", 4, MSG, OPT, ".v1beta1.DevicePluginOptions"),
    ],
    "NUMANode": [("ID", 1, INT64, OPT, "")],
    "TopologyInfo": [("nodes", 1, MSG, REP, ".v1beta1.NUMANode")],
    "Device": [
        ("ID", 1, STRING, OPT, ""),
        ("health", 2, STRING, OPT, ""),
        ("topology", 3, MSG, OPT, ".v1beta1.TopologyInfo"),
    ],
    "ListAndWatchResponse": [("devices", 1, MSG, REP, ".v1beta1.Device")],
    "ContainerPreferredAllocationRequest": [
        ("available_deviceIDs", 1, STRING, REP, ""),
        ("must_include_deviceIDs", 2, STRING, REP, ""),
        ("allocation_size", 3, INT32, OPT, ""),
    ],
    "PreferredAllocationRequest": [("container_requests", 1, MSG, REP, ".v1beta1.ContainerPreferredAllocationRequest")],
    "ContainerPreferredAllocationResponse": [("deviceIDs", 1, STRING, REP, "")],
    "PreferredAllocationResponse": [
        ("container_responses", 1, MSG, REP, ".v1beta1.ContainerPreferredAllocationResponse")
    ],
    "ContainerAllocateRequest": [("devices_ids", 1, STRING, REP, "")],
    "AllocateRequest": [("container_requests", 1, MSG, REP, ".v1beta1.ContainerAllocateRequest")],
    "Mount": [
        ("container_path", 1, STRING, OPT, ""),
        ("host_path", 2, STRING, OPT, ""),
        ("read_only", 3, BOOL, OPT, ""),
    ],
    "DeviceSpec": [
        ("container_path", 1, STRING, OPT, ""),
        ("host_path", 2, STRING, OPT, ""),
        ("permissions", 3, STRING, OPT, ""),
    ],
    # envs (1) and annotations (4) are maps; decoded here as repeated key/value entries, as on the wire.
    "StringEntry": [("key", 1, STRING, OPT, ""), ("value", 2, STRING, OPT, "")],
    "ContainerAllocateResponse": [
        ("envs", 1, MSG, REP, ".v1beta1.StringEntry"),
        ("mounts", 2, MSG, REP, ".v1beta1.Mount"),
        ("devices", 3, MSG, REP, ".v1beta1.DeviceSpec"),
        ("annotations", 4, MSG, REP, ".v1beta1.StringEntry"),
    ],
    "AllocateResponse": [("container_responses", 1, MSG, REP, ".v1beta1.ContainerAllocateResponse")],
    "PreStartContainerRequest": [("devices_ids", 1, STRING, REP, "")],
    "PreStartContainerResponse": [],
}


def _messages() -> dict[str, Any]:
    fdp = descriptor_pb2.FileDescriptorProto(
        name="independent/kubelet_v1beta1.proto", package="v1beta1", syntax="proto3"
    )
    for name, fields in OFFICIAL.items():
        msg = fdp.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            field = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1beta1.{name}")) for name in OFFICIAL}


M = _messages()


class IndependentKubelet:
    """A Registration server from the independent descriptors; records what plugins send."""

    def __init__(self, directory: Path) -> None:
        self.requests: list[Any] = []
        self.registered = threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler(
            "v1beta1.Registration",
            {
                "Register": grpc.unary_unary_rpc_method_handler(
                    self._register,
                    request_deserializer=M["RegisterRequest"].FromString,
                    response_serializer=lambda m: m.SerializeToString(),
                )
            },
        )
        self.server.add_generic_rpc_handlers((handler,))
        directory.mkdir(parents=True, exist_ok=True)
        self.server.add_insecure_port(f"unix:{directory / 'kubelet.sock'}")
        self.server.start()

    def _register(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        self.registered.set()
        return M["Empty"]()


@pytest.fixture
def independent(devplug_root: Path) -> Iterator[tuple[IndependentKubelet, DaemonProcess, Path]]:
    plugin_dir = devplug_root / "device-plugins"
    kubelet = IndependentKubelet(plugin_dir)
    mock_dir = devplug_root / "mock"
    (mock_dir).mkdir()
    (mock_dir / "dev-a").write_text("numa=1\n")
    (mock_dir / "dev-b").write_text("unhealthy\n")
    (mock_dir / "dev-c").write_text("")
    config = dev_config(devplug_root, {"example.com/wire": {"driver": "mock", "options": {"directory": str(mock_dir)}}})
    path = write_toml(devplug_root / "c.toml", config)
    daemon = DaemonProcess(path, devplug_root / "daemon.log").start()
    try:
        assert kubelet.registered.wait(15), daemon.log_text()
        yield kubelet, daemon, plugin_dir
    finally:
        assert daemon.stop() == 0, daemon.log_text()
        kubelet.server.stop(None)


def _unary(channel: grpc.Channel, method: str, request: Any, response: str) -> Any:
    call = channel.unary_unary(
        f"/v1beta1.DevicePlugin/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=M[response].FromString,
    )
    return call(request, timeout=10)


def test_registration_and_every_plugin_rpc_with_official_definitions(
    independent: tuple[IndependentKubelet, DaemonProcess, Path],
) -> None:
    kubelet, _, plugin_dir = independent
    request = kubelet.requests[0]
    assert request.version == "v1beta1"
    assert request.resource_name == "example.com/wire"
    assert "/" not in request.endpoint and request.endpoint.endswith(".sock")
    assert request.options.pre_start_required and request.options.get_preferred_allocation_available

    with grpc.insecure_channel(f"unix:{plugin_dir / request.endpoint}") as channel:
        options = _unary(channel, "GetDevicePluginOptions", M["Empty"](), "DevicePluginOptions")
        assert options.pre_start_required and options.get_preferred_allocation_available
        # The KEP flags travel as fields 100/101, unknown to the official message: skipped, not misread.
        unknown = unknown_fields.UnknownFieldSet(options)
        assert sorted(unknown[i].field_number for i in range(len(unknown))) == [100, 101]

        stream: Any = channel.unary_stream(
            "/v1beta1.DevicePlugin/ListAndWatch",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=M["ListAndWatchResponse"].FromString,
        )(M["Empty"](), timeout=10)
        first = next(stream)  # kept open: a cancelled stream means "kubelet gone" and the daemon re-registers
        seen = {d.ID: (d.health, [n.ID for n in d.topology.nodes]) for d in first.devices}
        assert seen == {"dev-a": ("Healthy", [1]), "dev-b": ("Unhealthy", []), "dev-c": ("Healthy", [])}

        preq = M["PreferredAllocationRequest"]()
        creq = preq.container_requests.add()
        creq.available_deviceIDs.extend(["dev-a", "dev-c"])
        creq.allocation_size = 1
        preferred = _unary(channel, "GetPreferredAllocation", preq, "PreferredAllocationResponse")
        assert len(preferred.container_responses) == 1
        assert list(preferred.container_responses[0].deviceIDs) in (["dev-a"], ["dev-c"])

        areq = M["AllocateRequest"]()
        areq.container_requests.add().devices_ids.extend(["dev-a", "dev-c"])
        answer = _unary(channel, "Allocate", areq, "AllocateResponse")
        container = answer.container_responses[0]
        assert {e.key: e.value for e in container.envs} == {"MOCK_DEVICES": "dev-a,dev-c"}
        assert sorted(d.container_path for d in container.devices) == ["/dev/mock/dev-a", "/dev/mock/dev-c"]
        assert all(d.permissions == "rw" for d in container.devices)
        assert sorted(m.container_path for m in container.mounts) == ["/var/run/mock/dev-a", "/var/run/mock/dev-c"]

        start = M["PreStartContainerRequest"]()
        start.devices_ids.extend(["dev-a", "dev-c"])
        assert (
            _unary(channel, "PreStartContainer", start, "PreStartContainerResponse") == M["PreStartContainerResponse"]()
        )
        stream.cancel()
