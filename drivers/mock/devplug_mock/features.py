"""The mock's options for contract 1.1's words (issue 41): partitions, share capacity and device status.

Each is off unless its option is set, so a config without them gives the mock of before.

``partitions``: a list of parents, each a table::

    partitions = [
        { parent = "card0", counters = { regions = 4 }, whole = "card0-whole", parts = 4 },
        { parent = "nic0", counters = { bandwidth = 100 }, devices = { nic0-vf0 = { bandwidth = 25 } } },
    ]

``parent`` names the parent (not a device itself: a device is never a part of itself), ``counters`` what it has
(DNS-label names, integers >= 1). ``whole`` (optional) is a device that consumes every counter in full (the card
offered whole); ``parts = N`` (optional) are the devices ``<parent>-part0`` .. ``<parent>-part<N-1>``, each
consuming ``1/N`` of every counter (each counter must divide by N); ``devices`` (optional) names devices and
what each consumes, explicitly. Every device named must be named once, in one parent; ``start`` creates the empty
files of those missing, as it does for ``count``. A device whose file is gone is simply not listed.

``share_capacity = { name = "memory", per_replica = 4294967296 }``: every device carries this
:class:`devplug.ShareCapacity` (the core uses it for devices shared among more than one container: ``replicas``).
Both keys are optional (``shares``, ``1``).

``device_status``: what ``allocate`` returns in ``ContainerAllocation.device_status`` for each of its devices:

* ``"ready"``: a condition ``Ready``/``True`` (reason ``Prepared``) and ``data`` ``{"mockDevice": <id>,
  "tenant": "<namespace>/<name>"}`` (the claim; ``"device-plugin"`` through the device-plugin API);
* ``"network"``: the same and ``network_data`` made up from the ID (:func:`mock_network_data`);
* ``"invalid"``: the same as ``"network"`` but with data that :mod:`devplug.types` accepts and the API server
  refuses (a 422), for the core's test of a refused status write (:func:`invalid_status`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal

from devplug import Claim
from devplug.options import unknown_key_hint
from devplug.types import DeviceCondition, DeviceStatus, NetworkData, Partition, ShareCapacity, device_id_problem

__all__ = [
    "DEVICE_PLUGIN_TENANT",
    "StatusMode",
    "invalid_status",
    "mock_network_data",
    "parse_partitions",
    "parse_share_capacity",
    "status_for",
]

StatusMode = Literal["ready", "network", "invalid"]

#: The ``tenant`` a status names when the allocation came through the device-plugin API (no claim).
DEVICE_PLUGIN_TENANT = "device-plugin"

_PARTITION_KEYS = ("parent", "counters", "whole", "parts", "devices")


def _counters(value: Any, where: str) -> dict[str, int]:
    if not isinstance(value, Mapping) or not value:
        raise ValueError(f"{where}: expected a table of counter names to integers, got {value!r}")
    out: dict[str, int] = {}
    for name, amount in value.items():
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 1:
            raise ValueError(f"{where}.{name}: expected an integer >= 1, got {amount!r}")
        out[str(name)] = amount
    return out


def _device_id(value: Any, where: str) -> str:
    problem = device_id_problem(value) if isinstance(value, str) else "it is not a string"
    if problem is not None:
        raise ValueError(f"{where}: {value!r} is no device ID: {problem}")
    return str(value)


def _one_parent(entry: Any, where: str) -> dict[str, Partition]:
    """The devices of one ``partitions`` entry and their :class:`Partition`, checked (errors name the key)."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: expected a table (parent, counters, whole, parts, devices), got {entry!r}")
    for key in entry:
        if key not in _PARTITION_KEYS:
            raise ValueError(f"{where}.{key}: unknown key; {unknown_key_hint(str(key), _PARTITION_KEYS)}")
    if "parent" not in entry:
        raise ValueError(f"{where}.parent: missing required key (a string)")
    if "counters" not in entry:
        raise ValueError(f"{where}.counters: missing required key (a table of counter names to integers)")
    parent = _device_id(entry["parent"], f"{where}.parent")
    counters = _counters(entry["counters"], f"{where}.counters")
    consumes: dict[str, dict[str, int]] = {}

    def add(device_id: str, amounts: dict[str, int], key: str) -> None:
        if device_id == parent:
            raise ValueError(f"{key}: {device_id!r} is the parent itself (a device is never a part of itself)")
        if device_id in consumes:
            raise ValueError(f"{key}: device {device_id!r} is named twice")
        consumes[device_id] = amounts

    if "whole" in entry:
        add(_device_id(entry["whole"], f"{where}.whole"), dict(counters), f"{where}.whole")
    if "parts" in entry:
        count = entry["parts"]
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1024:
            raise ValueError(f"{where}.parts: expected an integer from 1 to 1024, got {count!r}")
        uneven = [name for name, amount in counters.items() if amount % count]
        if uneven:
            raise ValueError(
                f"{where}.parts: {count} parts cannot share counter {uneven[0]!r} ({counters[uneven[0]]}) evenly"
            )
        share = {name: amount // count for name, amount in counters.items()}
        for i in range(count):
            add(f"{parent}-part{i}", dict(share), f"{where}.parts")
    devices = entry.get("devices", {})
    if not isinstance(devices, Mapping):
        raise ValueError(f"{where}.devices: expected a table of device IDs to counters, got {devices!r}")
    for device_id, amounts in devices.items():
        key = f"{where}.devices.{device_id}"
        add(_device_id(device_id, key), _counters(amounts, key), key)
    if not consumes:
        raise ValueError(f"{where}: names no device (give whole, parts or devices)")
    parts: dict[str, Partition] = {}
    for device_id, amounts in consumes.items():
        try:
            parts[device_id] = Partition(parent, counters, amounts)
        except ValueError as exc:
            raise ValueError(f"{where} (device {device_id!r}): {exc}") from None
    return parts


def parse_partitions(entries: Sequence[Any]) -> Mapping[str, Partition]:
    """The ``partitions`` option: each device ID it names -> its :class:`Partition` (``ValueError`` naming
    ``partitions[i].<key>`` for bad input, a device named twice or a parent named twice)."""
    found: dict[str, Partition] = {}
    parents: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"partitions[{i}]"
        parts = _one_parent(entry, where)
        parent = next(iter(parts.values())).parent
        if parent in parents:
            raise ValueError(f"{where}.parent: {parent!r} is named by an earlier entry too")
        parents.add(parent)
        for device_id, partition in parts.items():
            if device_id in found or device_id in parents:
                raise ValueError(f"{where}: device {device_id!r} is named by an earlier entry too")
            found[device_id] = partition
    clash = parents & set(found)
    if clash:
        raise ValueError(f"partitions: {sorted(clash)[0]!r} is both a parent and a part")
    return MappingProxyType(found)


def parse_share_capacity(table: Mapping[str, Any]) -> ShareCapacity:
    """The ``share_capacity`` option (``name``, ``per_replica``, both optional), checked by :class:`ShareCapacity`."""
    for key in table:
        if key not in ("name", "per_replica"):
            raise ValueError(
                f"share_capacity.{key}: unknown key; {unknown_key_hint(str(key), ('name', 'per_replica'))}"
            )
    try:
        return ShareCapacity(**dict(table))
    except ValueError as exc:
        raise ValueError(f"share_capacity: {exc}") from None


def mock_network_data(device_id: str) -> NetworkData:
    """Made-up network data for ``device_id``, the same every time: from the ID's SHA-256 ``d``, the interface
    ``mock-<d[:8] in hex>``, the address ``10.<d0>.<d1>.<d2 % 254 + 1>/16`` and the locally administered MAC
    ``02:<d3>:<d4>:<d5>:<d6>:<d7>``."""
    digest = hashlib.sha256(device_id.encode()).digest()
    return NetworkData(
        interface_name=f"mock-{digest[:4].hex()}",
        ips=(f"10.{digest[0]}.{digest[1]}.{digest[2] % 254 + 1}/16",),
        hardware_address=":".join(f"{b:02x}" for b in (0x02, *digest[3:8])),
    )


def _tenant(claim: Claim | None) -> str:
    return DEVICE_PLUGIN_TENANT if claim is None else f"{claim.namespace}/{claim.name}"


def invalid_status(device_id: str, claim: Claim | None) -> DeviceStatus:
    """A status :mod:`devplug.types` builds but a 1.36 API server refuses (422), on two counts (each from
    ``validateDeviceStatus`` in ``pkg/apis/resource/validation/validation.go``):

    * its condition's type has a name part of 64 characters: ``metav1validation.ValidateConditions`` checks each
      type with ``ValidateLabelName`` (``k8s.io/apimachinery/pkg/apis/meta/v1/validation/validation.go``), that is
      ``IsQualifiedName`` (``k8s.io/apimachinery/pkg/util/validation/validation.go``): at most 63 characters
      after the optional ``prefix/``;
    * its address ``::ffff:a00:1/120`` is an IPv4-mapped IPv6 address: ``validateNetworkDeviceData`` checks each
      of ``ips`` with ``IsValidInterfaceAddress`` (``k8s.io/apimachinery/pkg/util/validation/ip.go``), which reads
      it as IPv4 and wants its canonical form ``10.0.0.1/24``; Python's ``ipaddress`` keeps the IPv6 form.
    """
    return DeviceStatus(
        conditions=(DeviceCondition("R" * 64, "True", "Prepared", f"mock device {device_id} prepared"),),
        data={"mockDevice": device_id, "tenant": _tenant(claim)},
        network_data=NetworkData(interface_name="mock-invalid", ips=("::ffff:a00:1/120",)),
    )


def status_for(device_id: str, claim: Claim | None, mode: StatusMode) -> DeviceStatus:
    """The status ``allocate`` returns for ``device_id`` under the ``device_status`` option's ``mode``."""
    if mode == "invalid":
        return invalid_status(device_id, claim)
    return DeviceStatus(
        conditions=(DeviceCondition("Ready", "True", "Prepared", f"mock device {device_id} prepared"),),
        data={"mockDevice": device_id, "tenant": _tenant(claim)},
        network_data=mock_network_data(device_id) if mode == "network" else None,
    )
