"""The ``command`` backend: a vendor tool (``xbutil``/``xbmgmt``, ``fpgaconf``, a site script) does the work.

The cards are the configured PCI addresses, each with ``regions_per_card``
regions numbered from 0. Each command is an argument list with ``{address}``,
``{region}`` and ``{bitstream}`` placeholders, run without a shell under
``command_timeout`` (:func:`devplug_fpga.command.run_tool`). A whole card is
programmed, deprogrammed and verified region by region.
"""

from __future__ import annotations

from pathlib import Path

from devplug import DeviceSpec
from devplug_fpga.command import PidRecorder, ToolError, run_tool
from devplug_fpga.devices import Card, Region, Target
from devplug_fpga.options import FpgaOptions, expand

__all__ = ["CommandBackend"]


class CommandBackend:
    """Cards handled by vendor tools."""

    def __init__(self, options: FpgaOptions) -> None:
        self.options = options

    def scan(self) -> list[Card]:
        """The configured cards (a tool cannot tell us which exist; ``health_command`` can)."""
        return [
            Card(address, tuple(Region(address, i) for i in range(self.options.regions_per_card)))
            for address in self.options.cards
        ]

    def _run(self, argv: tuple[str, ...], on_start: PidRecorder | None = None, **values: str) -> str:
        return run_tool(expand(argv, **values), self.options.command_timeout, on_start)

    def device_specs(self, target: Target) -> list[DeviceSpec]:
        """``device_nodes`` filled in for each of the target's regions (each node once)."""
        paths: dict[str, None] = {}
        for region in target.regions:
            for template in self.options.device_nodes:
                paths[template.format(address=target.card.address, region=str(region.index))] = None
        return [DeviceSpec(p, p, "rw") for p in paths]

    def afu_id(self, region: Region) -> str | None:
        """Tools report no AFU ID the driver could read."""
        return None

    def program(
        self, card: Card, region: Region, image: Path, afu_id: str | None, on_start: PidRecorder | None = None
    ) -> None:
        """``program_command`` with ``{bitstream}`` = ``image``."""
        self._run(
            self.options.program_command, on_start, address=card.address, region=str(region.index), bitstream=str(image)
        )

    def deprogram(self, card: Card, region: Region, on_start: PidRecorder | None = None) -> None:
        """``deprogram_command`` (``{bitstream}`` = ``blank_image``)."""
        blank = str(self.options.blank_image) if self.options.blank_image is not None else ""
        self._run(
            self.options.deprogram_command, on_start, address=card.address, region=str(region.index), bitstream=blank
        )

    def verify(self, card: Card, region: Region, on_start: PidRecorder | None = None) -> None:
        """``verify_command``, when configured; its success is the verification."""
        if self.options.verify_command:
            self._run(self.options.verify_command, on_start, address=card.address, region=str(region.index))

    def power_save(self, card: Card) -> str | None:
        """``power_save_command`` for the card, when configured."""
        if self.options.power_save_command:
            self._run(self.options.power_save_command, address=card.address)
        return None

    def power_restore(self, card: Card, previous: str) -> None:
        """Nothing to restore: the vendor tool programs the card back to full power."""

    def problems(self, target: Target) -> list[str]:
        """``health_command`` for the card: a failure is the reason."""
        if not self.options.health_command:
            return []
        try:
            self._run(self.options.health_command, address=target.card.address)
        except ToolError as exc:
            return [str(exc)]
        return []
