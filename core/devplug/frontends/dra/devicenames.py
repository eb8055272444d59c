"""ResourceSlice device names for devplug device IDs, and the map back.

A device in a ResourceSlice is named by a DNS label (``spec.devices[].name``:
``IsDNS1123Label``, at most 63 characters of ``a-z``, ``0-9`` and ``-``, starting
and ending with a letter or digit; ``k8s.io/api/resource/v1/types.go``), and a
claim's allocation names the device the same way. A devplug device ID is any
printable string of up to 256 bytes (:func:`devplug.types.device_id_problem`):
upper case, ``/``, ``.``, ``:`` (a PCI address ``0000:3b:00.1``), the ``::`` of a
replica (``mock0::3``), other scripts.

:func:`device_name` maps one to the other, depending on the ID alone, so a name is
the same on every node and after every restart:

* an ID that is already a DNS label is its own name (``gpu0``, ``mock-3``), unless
  it ends like a hashed name (below), which would let it take another ID's name;
* any other ID becomes a readable stem (lower-cased, every run of other characters
  as one ``-``, cut to 49 characters) followed by ``-`` and 13 characters of the
  base32 SHA-256 of its UTF-8 bytes (65 bits): ``0000:3b:00.1`` ->
  ``0000-3b-00-1-<13 characters>``, ``GPU0`` -> ``gpu0-<13 characters>``.

So a name passed through unchanged never ends like a hashed one, and two IDs
share a name only if their stems and 65-bit hashes both agree (about one chance in
10^16 for a node of 1,000 devices). No mapping of 256-byte strings into 63
characters can be injective for every set of IDs; :class:`DeviceNameMap` checks
the IDs it is given and refuses a collision by name, rather than publish two
devices as one.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping

__all__ = ["MAX_NAME_LENGTH", "DeviceNameCollisionError", "DeviceNameMap", "device_name", "is_dns_label"]

#: ``validation.DNS1123LabelMaxLength``.
MAX_NAME_LENGTH = 63
_HASH_LENGTH = 13
_STEM_LENGTH = MAX_NAME_LENGTH - 1 - _HASH_LENGTH
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_NOT_LABEL_CHARS = re.compile(r"[^a-z0-9]+")
#: The tail every hashed name has: ``-`` and 13 characters of lower-case base32.
_HASHED_TAIL = re.compile(rf"(^|-)[a-z2-7]{{{_HASH_LENGTH}}}$")


def is_dns_label(name: str) -> bool:
    """True when ``name`` is a DNS label (RFC 1123, at most 63 characters), as a ResourceSlice device name must be."""
    return len(name) <= MAX_NAME_LENGTH and _LABEL.match(name) is not None


def _hash(device_id: str) -> str:
    digest = hashlib.sha256(device_id.encode(errors="surrogatepass")).digest()
    return base64.b32encode(digest).decode().lower()[:_HASH_LENGTH]


@functools.lru_cache(maxsize=65536)
def device_name(device_id: str) -> str:
    """The ResourceSlice device name of a devplug device ID (see the module's docstring); stable across restarts.

    An empty ID has no name (``ValueError``): devplug never advertises one.
    """
    if not device_id:
        raise ValueError("an empty device ID has no ResourceSlice device name")
    if is_dns_label(device_id) and not _HASHED_TAIL.search(device_id):
        return device_id
    lowered = "".join(ch.lower() if ch.isascii() else "-" for ch in device_id)
    stem = _NOT_LABEL_CHARS.sub("-", lowered)[:_STEM_LENGTH].strip("-")
    return f"{stem}-{_hash(device_id)}" if stem else _hash(device_id)


class DeviceNameCollisionError(ValueError):
    """Two device IDs would be published under one ResourceSlice device name; nothing is published."""


class DeviceNameMap(Mapping[str, str]):
    """The device names of a set of device IDs, both ways: ``names[device_id]`` and :meth:`device_id`.

    Raises :class:`DeviceNameCollisionError` naming both IDs when two of them share a name.
    """

    __slots__ = ("_by_id", "_by_name")

    def __init__(self, device_ids: Iterable[str] = ()) -> None:
        self._by_id: dict[str, str] = {}
        self._by_name: dict[str, str] = {}
        for device_id in device_ids:
            if device_id in self._by_id:
                continue
            name = device_name(device_id)
            other = self._by_name.get(name)
            if other is not None:
                raise DeviceNameCollisionError(
                    f"device IDs {other!r} and {device_id!r} both map to the ResourceSlice device name {name!r}: "
                    "rename one of them (devplug.frontends.dra.devicenames)"
                )
            self._by_id[device_id] = name
            self._by_name[name] = device_id

    def __getitem__(self, device_id: str) -> str:
        return self._by_id[device_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def device_id(self, name: str) -> str | None:
        """The device ID published under ``name``, or ``None`` when no device of the map has that name."""
        return self._by_name.get(name)

    def names(self) -> list[str]:
        """Every device name, in the order the IDs were given."""
        return list(self._by_name)
