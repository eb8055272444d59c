"""One resource per device: a driver's check that no two resources take the same device.

The engine knows nothing of what a driver's devices are, and each driver
instance sees only its own resource; two resources whose options select the
same device would fight over it. A driver refuses that in its
``check_resources`` classmethod (called with every resource's options when the
config is checked), and, where the devices can only be known on the node, in
``start`` against the other resources of the process. :class:`DeviceOwners`
does the bookkeeping and says it the same way every time::

    @classmethod
    def check_resources(cls, options_by_resource):
        owners = DeviceOwners("drive", hint="; list each drive in one resource's serials")
        for resource, options in options_by_resource.items():
            for serial in options.serials:
                owners.take(serial, resource, f"drive {serial}")

raises ``ValueError("drive S123 is claimed by both example.com/a and example.com/b: a drive belongs to one
resource; list each drive in one resource's serials")``, which the core turns into a config error naming the
file and both resources. Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable

__all__ = ["DeviceOwners"]


class DeviceOwners:
    """Which resource has taken each device (by any hashable key); a second resource's take is refused.

    ``thing`` names a device in messages ("a VF belongs to one resource"), ``hint`` (appended as given) says
    what to change, ``verb`` how the options take a device ("selected", "claimed").
    """

    def __init__(self, thing: str = "device", *, hint: str = "", verb: str = "claimed") -> None:
        self.thing = thing
        self.hint = hint
        self.verb = verb
        self._owners: dict[Hashable, str] = {}
        self._lock = threading.Lock()

    def owner(self, key: Hashable) -> str | None:
        """The resource that took ``key``, if any."""
        with self._lock:
            return self._owners.get(key)

    def take(self, key: Hashable, resource: str, shown: str) -> None:
        """Give ``key`` (named ``shown`` in messages) to ``resource``; ``ValueError`` when another has it."""
        self.take_all([(key, shown)], resource)

    def take_all(self, devices: Iterable[tuple[Hashable, str]], resource: str) -> None:
        """Give every ``(key, shown)`` to ``resource``, all or none; ``ValueError`` names the first taken by
        another resource."""
        wanted = list(devices)
        with self._lock:
            for key, shown in wanted:
                other = self._owners.get(key)
                if other is not None and other != resource:
                    raise ValueError(
                        f"{shown} is {self.verb} by both {other} and {resource}: "
                        f"{_article(self.thing)} {self.thing} belongs to one resource{self.hint}"
                    )
            for key, _ in wanted:
                self._owners[key] = resource

    def release(self, resource: str, only: Callable[[Hashable], bool] | None = None) -> None:
        """Forget the devices ``resource`` took (those whose key ``only`` accepts, when given)."""
        with self._lock:
            for key in [k for k, v in self._owners.items() if v == resource and (only is None or only(k))]:
                del self._owners[key]


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" and word.upper() != word else "a"
