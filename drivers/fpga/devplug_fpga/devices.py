"""Cards, their regions, and the devices a resource advertises for them in each mode.

A card is known by its PCI address, a region by the card's address and its
number on the card (the DFL port ``id``). Device IDs:

* a whole card: its PCI address, ``0000:3b:00.0``;
* a region: ``0000:3b:00.0-region0``.

In ``both`` mode a card and its regions overlap: :func:`overlapping` says which.

With the ``partitions`` option (contract 1.1, KEP-4815), :func:`partition` says the same in the core's words:
each card is a parent named ``<address>-card`` (not the card's own ID, which the whole card's device has: a
device is never a part of itself) with one counter, ``regions``, the number of its ports; a region consumes 1 of
it, the whole card all of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from devplug.types import Partition
from devplug_fpga.options import Mode

__all__ = [
    "REGIONS_COUNTER",
    "Card",
    "Region",
    "Target",
    "card_parent",
    "overlapping",
    "partition",
    "region_id",
    "targets",
]

#: The counter of a card's parent: how many regions (DFL ports) it has.
REGIONS_COUNTER = "regions"


@dataclass(frozen=True)
class Region:
    """One partial-reconfiguration region of a card (a DFL port)."""

    card: str
    index: int
    port: str | None = None  # dfl-port.M (dfl backend)

    @property
    def id(self) -> str:
        """The region's device ID."""
        return region_id(self.card, self.index)


@dataclass(frozen=True)
class Card:
    """One FPGA card."""

    address: str
    regions: tuple[Region, ...]
    fme: str | None = None  # dfl-fme.N (dfl backend)
    numa_node: int = -1


@dataclass(frozen=True)
class Target:
    """A device the resource advertises: a whole card, or one region of it."""

    id: str
    card: Card
    regions: tuple[Region, ...]
    whole: bool


def region_id(address: str, index: int) -> str:
    """``<address>-region<index>``."""
    return f"{address}-region{index}"


def targets(cards: Iterable[Card], mode: Mode) -> dict[str, Target]:
    """The devices of ``cards`` in ``mode``, by ID."""
    out: dict[str, Target] = {}
    for card in cards:
        if mode in ("whole", "both"):
            out[card.address] = Target(card.address, card, card.regions, True)
        if mode in ("regions", "both"):
            for region in card.regions:
                out[region.id] = Target(region.id, card, (region,), False)
    return out


def overlapping(target: Target, all_targets: Iterable[Target]) -> list[str]:
    """The IDs of the other devices that share hardware with ``target`` (its card, or its card's regions)."""
    return [
        other.id
        for other in all_targets
        if other.id != target.id
        and other.card.address == target.card.address
        and {r.index for r in other.regions} & {r.index for r in target.regions}
    ]


def card_parent(address: str) -> str:
    """The name of a card as the parent of its devices: ``<address>-card``."""
    return f"{address}-card"


def partition(target: Target, card: Card | None = None) -> Partition | None:
    """``target`` as a part of its card (``card``: the card as found now, when the target was found earlier): a
    region consumes 1 of the card's ``regions``, a whole card all of them; ``None`` for a card without regions (a
    counter is at least 1: ``Partition``). Every part of a card must give the card the same counters, so a region
    that vanished is counted against the card as it is now."""
    count = len((card or target.card).regions)
    if count == 0 or len(target.regions) > count:
        return None
    return Partition(card_parent(target.card.address), {REGIONS_COUNTER: count}, {REGIONS_COUNTER: len(target.regions)})
