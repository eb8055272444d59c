"""What the driver asks of a backend (:mod:`devplug_fpga.dfl` or :mod:`devplug_fpga.vendor`)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from devplug import DeviceSpec
from devplug_fpga.command import PidRecorder
from devplug_fpga.devices import Card, Region, Target

__all__ = ["FpgaBackend"]


class FpgaBackend(Protocol):
    """Find cards, program, deprogram and verify regions, save power, report health."""

    def scan(self) -> list[Card]:
        """The cards present."""
        ...

    def device_specs(self, target: Target) -> list[DeviceSpec]:
        """The device nodes a container gets for ``target``."""
        ...

    def afu_id(self, region: Region) -> str | None:
        """The AFU ID the region holds now, when the backend can tell."""
        ...

    def program(
        self, card: Card, region: Region, image: Path, afu_id: str | None, on_start: PidRecorder | None = None
    ) -> None:
        """Load ``image`` into ``region`` (and check it holds ``afu_id`` then); raises FpgaError."""
        ...

    def deprogram(self, card: Card, region: Region, on_start: PidRecorder | None = None) -> None:
        """Clean ``region``: the blank image, or a reset; raises FpgaError."""
        ...

    def verify(self, card: Card, region: Region, on_start: PidRecorder | None = None) -> None:
        """Check ``region`` is clean; raises FpgaError."""
        ...

    def power_save(self, card: Card) -> str | None:
        """Put a free card in power save; returns what :meth:`power_restore` needs, if anything."""
        ...

    def power_restore(self, card: Card, previous: str) -> None:
        """Undo :meth:`power_save` before the card is used."""
        ...

    def problems(self, target: Target) -> list[str]:
        """Why ``target`` is unhealthy (empty: it is healthy)."""
        ...
