"""The wire contract: generated code is current, and field numbers and method paths match the kubelet's.

The device-plugin and PodResources facts are those of /work/shared/kubelet-contract.md; the DRA ones those of the
kubelet's pkg/apis/dra/v1 and v1beta1, dra-health/v1alpha1 and pluginregistration/v1 (kubernetes-1.36).
"""

from __future__ import annotations

import filecmp
import importlib.util
import sys
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.api.gen.dra.v1 import api_pb2 as dra_v1
from devplug.api.gen.dra.v1 import api_pb2_grpc as dra_v1_grpc
from devplug.api.gen.dra.v1beta1 import api_pb2 as dra_v1beta1
from devplug.api.gen.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from devplug.api.gen.drahealth.v1alpha1 import api_pb2 as health
from devplug.api.gen.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from devplug.api.gen.pluginregistration.v1 import api_pb2 as reg
from devplug.api.gen.pluginregistration.v1 import api_pb2_grpc as reg_grpc
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


# -- DRA (kubelet pkg/apis/dra/v1 and v1beta1, dra-health/v1alpha1, pluginregistration/v1; kubernetes-1.36) --------


def _method_paths(module: Any, service: str) -> list[str]:
    """The paths a gRPC client puts on the wire for every method of ``service`` (``/<package>.<service>/<method>``)."""
    desc = module.DESCRIPTOR.services_by_name[service]
    return [f"/{desc.full_name}/{m.name}" for m in desc.methods]


def _source(module: Any) -> str:
    return Path(module.__file__).read_text()


def _repeated(message: type) -> set[str]:
    return {f.name for f in message.DESCRIPTOR.fields if f.is_repeated}  # type: ignore[attr-defined]


def _dra_common(module: Any) -> None:
    assert _fields(module.NodePrepareResourcesRequest) == {"claims": 1}
    assert _fields(module.NodePrepareResourcesResponse) == {"claims": 1}
    assert _fields(module.NodePrepareResourceResponse) == {"devices": 1, "error": 2}
    assert _fields(module.NodeUnprepareResourcesRequest) == {"claims": 1}
    assert _fields(module.NodeUnprepareResourcesResponse) == {"claims": 1}
    assert _fields(module.NodeUnprepareResourceResponse) == {"error": 1}
    assert _fields(module.Claim) == {"namespace": 1, "uid": 2, "name": 3}
    for response, value in (
        (module.NodePrepareResourcesResponse, "NodePrepareResourceResponse"),
        (module.NodeUnprepareResourcesResponse, "NodeUnprepareResourceResponse"),
    ):
        entry = response.DESCRIPTOR.fields_by_name["claims"].message_type
        assert entry.GetOptions().map_entry, f"{response.__name__}.claims must be a map"
        assert entry.fields_by_name["key"].type == FieldDescriptor.TYPE_STRING
        assert entry.fields_by_name["value"].message_type.name == value
    assert _repeated(module.NodePrepareResourcesRequest) == {"claims"}
    assert _repeated(module.NodePrepareResourceResponse) == {"devices"}
    assert _repeated(module.Device) == {"request_names", "cdi_device_ids"}
    # The bytes on the wire follow from the numbers: tags 0x0a, 0x12, 0x1a for fields 1, 2, 3 (length-delimited).
    assert module.Claim(namespace="ns", uid="u", name="n").SerializeToString() == b"\n\x02ns\x12\x01u\x1a\x01n"


def test_dra_v1_has_the_kubelets_package_methods_and_field_numbers() -> None:
    assert dra_v1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    assert dra_v1.DESCRIPTOR.name == "dra/v1/api.proto"
    assert _method_paths(dra_v1, "DRAPlugin") == [
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
    ]
    for path in _method_paths(dra_v1, "DRAPlugin"):
        assert f"'{path}'" in _source(dra_v1_grpc), f"the generated stub does not call {path}"
    _dra_common(dra_v1)
    assert _fields(dra_v1.Device) == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    assert dra_v1.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence, "share_id is `optional string`"
    assert dra_v1.Device().HasField("share_id") is False


def test_dra_v1beta1_is_v1_without_share_id_under_its_own_package() -> None:
    assert dra_v1beta1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1beta1"
    assert dra_v1beta1.DESCRIPTOR.name == "dra/v1beta1/api.proto"
    assert _method_paths(dra_v1beta1, "DRAPlugin") == [
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
    ]
    for path in _method_paths(dra_v1beta1, "DRAPlugin"):
        assert f"'{path}'" in _source(dra_v1beta1_grpc), f"the generated stub does not call {path}"
    _dra_common(dra_v1beta1)
    assert _fields(dra_v1beta1.Device) == {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4}


def test_dra_health_v1alpha1_has_the_kubelets_package_stream_enum_and_field_numbers() -> None:
    assert health.DESCRIPTOR.package == "v1alpha1"
    assert health.DESCRIPTOR.name == "drahealth/v1alpha1/api.proto"
    assert _method_paths(health, "DRAResourceHealth") == ["/v1alpha1.DRAResourceHealth/NodeWatchResources"]
    assert "'/v1alpha1.DRAResourceHealth/NodeWatchResources'" in _source(health_grpc)
    method = health.DESCRIPTOR.services_by_name["DRAResourceHealth"].methods_by_name["NodeWatchResources"]
    assert method.server_streaming and not method.client_streaming
    assert {v.name: v.number for v in health.HealthStatus.DESCRIPTOR.values} == {
        "UNKNOWN": 0,
        "HEALTHY": 1,
        "UNHEALTHY": 2,
    }
    assert _fields(health.NodeWatchResourcesRequest) == {}
    assert _fields(health.NodeWatchResourcesResponse) == {"devices": 1}
    assert _repeated(health.NodeWatchResourcesResponse) == {"devices"}
    assert _fields(health.DeviceIdentifier) == {"pool_name": 1, "device_name": 2}
    assert _fields(health.DeviceHealth) == {
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    }
    types = {f.name: f.type for f in health.DeviceHealth.DESCRIPTOR.fields}
    assert types["last_updated_time"] == types["health_check_timeout_seconds"] == FieldDescriptor.TYPE_INT64
    assert types["health"] == FieldDescriptor.TYPE_ENUM


def test_plugin_registration_v1_is_package_pluginregistration() -> None:
    assert reg.DESCRIPTOR.package == "pluginregistration"
    assert reg.DESCRIPTOR.name == "pluginregistration/v1/api.proto"
    assert _method_paths(reg, "Registration") == [
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
    ]
    for path in _method_paths(reg, "Registration"):
        assert f"'{path}'" in _source(reg_grpc), f"the generated stub does not call {path}"
    assert _fields(reg.PluginInfo) == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
    assert _repeated(reg.PluginInfo) == {"supported_versions"}
    assert _fields(reg.RegistrationStatus) == {"plugin_registered": 1, "error": 2}
    assert _fields(reg.InfoRequest) == {}
    assert _fields(reg.RegistrationStatusResponse) == {}
