"""The wire contract: generated code is current, and field numbers and method paths match the kubelet's."""

from __future__ import annotations

import filecmp
import importlib.util
import sys
from pathlib import Path
from typing import Any

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.api.gen.podresources.v1 import api_pb2 as pr

ROOT = Path(__file__).resolve().parent.parent


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "tools" / "gen_proto.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_proto"] = module
    spec.loader.exec_module(module)
    return module


def test_committed_generated_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    gen = _generator()
    fresh = tmp_path / "gen"
    gen.generate(fresh)
    committed = ROOT / "core" / "devplug" / "api" / "gen"
    fresh_files = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
    committed_files = sorted(
        p.relative_to(committed) for p in committed.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    assert fresh_files == committed_files, "run `make proto` and commit the result"
    differing = [str(p) for p in fresh_files if not filecmp.cmp(fresh / p, committed / p, shallow=False)]
    assert differing == [], f"stale generated code (run `make proto`): {differing}"


def _fields(message: type) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_device_plugin_messages_have_the_kubelets_field_numbers() -> None:
    assert dp.DESCRIPTOR.package == "v1beta1"
    assert dp.DESCRIPTOR.name == "deviceplugin/v1beta1/api.proto"
    assert _fields(dp.RegisterRequest) == {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}
    assert _fields(dp.Device) == {"ID": 1, "health": 2, "topology": 3}
    assert _fields(dp.ContainerAllocateResponse) == {
        "envs": 1,
        "mounts": 2,
        "devices": 3,
        "annotations": 4,
        "cdi_devices": 5,
    }
    assert _fields(dp.ContainerPreferredAllocationRequest) == {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    }
    assert _fields(dp.DeviceSpec) == {"container_path": 1, "host_path": 2, "permissions": 3}
    assert _fields(dp.Mount) == {"container_path": 1, "host_path": 2, "read_only": 3}
    official = {"pre_start_required": 1, "get_preferred_allocation_available": 2}
    extension = {"post_stop_required": 100, "deallocate_available": 101}
    assert _fields(dp.DevicePluginOptions) == official | extension


def test_services_and_methods() -> None:
    plugin = dp.DESCRIPTOR.services_by_name["DevicePlugin"]
    assert [m.name for m in plugin.methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
        "PostStopContainer",
        "Deallocate",
    ]
    assert plugin.methods_by_name["ListAndWatch"].server_streaming
    assert [m.name for m in dp.DESCRIPTOR.services_by_name["Registration"].methods] == ["Register"]
    lister = pr.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert pr.DESCRIPTOR.package == "v1"
    assert [m.name for m in lister.methods] == ["List", "GetAllocatableResources", "Get"]
    assert _fields(pr.ContainerDevices) == {"resource_name": 1, "device_ids": 2, "topology": 3}
    assert _fields(pr.DynamicResource) == {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4}
