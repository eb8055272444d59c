"""The ``dfl`` backend: cards found in the kernel's DFL sysfs, programmed through the DFL ioctls.

Cards are the base FPGA regions under ``/sys/class/fpga_region`` that hold a
``dfl-fme.N`` (``Documentation/fpga/dfl.rst``, "Device enumeration"); their
regions are the ``dfl-port.M`` beside it, numbered by the port's ``id``.
Programming is ``DFL_FPGA_FME_PORT_PR`` on ``/dev/dfl-fme.N``; deprogramming
loads the blank image the same way (or, without one, resets the port with
``DFL_FPGA_PORT_RESET``); verifying reads the port's ``afu_id`` (and the FME's
``bitstream_id`` when one is configured).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from devplug import DeviceSpec
from devplug_fpga.command import FpgaError, PidRecorder
from devplug_fpga.devices import Card, Region, Target
from devplug_fpga.door import DflAccess, port_pr, port_reset
from devplug_fpga.options import FpgaOptions

__all__ = ["DflBackend"]

_FME_ERRORS = ("fme_errors", "pcie0_errors", "pcie1_errors", "nonfatal_errors", "catfatal_errors")
_HOST_DEV = Path("/dev")


class DflBackend:
    """Cards and regions of the DFL framework, behind a :class:`DflAccess`."""

    def __init__(self, options: FpgaOptions, access: DflAccess) -> None:
        self.options = options
        self.access = access
        self._regions_dir = access.sysfs_root / "class/fpga_region"
        self._platform = access.sysfs_root / "bus/platform/devices"

    # --- discovery -------------------------------------------------------------------

    def scan(self) -> list[Card]:
        """The cards present (those named in ``cards``, or all), in address order."""
        try:
            regions = self.access.listdir(self._regions_dir)
        except FileNotFoundError:
            return []
        cards = []
        for name in regions:
            card = self._card(name)
            if card is not None and (not self.options.cards or card.address in self.options.cards):
                cards.append(card)
        return sorted(cards, key=lambda c: c.address)

    def _card(self, region: str) -> Card | None:
        try:
            folder = self.access.resolve(self._regions_dir / region)
            names = self.access.listdir(folder)
        except OSError:
            return None  # removed while we looked
        fmes = [n for n in names if n.startswith("dfl-fme.")]
        if not fmes:
            return None  # a PR region, not a card
        if folder.parent.name != "fpga_region":
            return None
        address = folder.parent.parent.name
        regions = []
        for port in (n for n in names if n.startswith("dfl-port.")):
            try:
                index = int(self.access.read_text(folder / port / "id"))
            except (OSError, ValueError):
                continue
            regions.append(Region(address, index, port))
        numa = -1
        with contextlib.suppress(OSError, ValueError):
            numa = int(self.access.read_text(folder.parent.parent / "numa_node"))
        return Card(address, tuple(sorted(regions, key=lambda r: r.index)), fmes[0], numa)

    # --- allocation --------------------------------------------------------------------

    def device_specs(self, target: Target) -> list[DeviceSpec]:
        """The port nodes of the target's regions, and the FME node for a whole card (host paths)."""
        specs = []
        if target.whole and target.card.fme is not None:
            specs.append(DeviceSpec(f"{_HOST_DEV}/{target.card.fme}", f"{_HOST_DEV}/{target.card.fme}", "rw"))
        for region in target.regions:
            specs.append(DeviceSpec(f"{_HOST_DEV}/{region.port}", f"{_HOST_DEV}/{region.port}", "rw"))
        return specs

    def afu_id(self, region: Region) -> str | None:
        """What the region holds now (its port's ``afu_id``), or ``None`` when unreadable."""
        try:
            return self.access.read_text(self._platform / str(region.port) / "afu_id").lower()
        except OSError:
            return None

    def program(
        self, card: Card, region: Region, image: Path, afu_id: str | None, on_start: PidRecorder | None = None
    ) -> None:
        """Partial reconfiguration of ``region`` with ``image``; then its ``afu_id`` must read ``afu_id``."""
        try:
            data = Path(image).read_bytes()
        except OSError as exc:
            raise FpgaError(f"{region.id}: cannot read {image}: {exc}") from exc
        fme = self.access.dev_root / str(card.fme)
        try:
            port_pr(self.access, fme, region.index, data)
        except OSError as exc:
            raise FpgaError(f"{region.id}: DFL_FPGA_FME_PORT_PR of {image} through {fme} failed: {exc}") from exc
        if afu_id is not None:
            found = self.afu_id(region)
            if found != afu_id:
                raise FpgaError(f"{region.id}: after programming {image}, afu_id reads {found}, expected {afu_id}")

    def deprogram(self, card: Card, region: Region, on_start: PidRecorder | None = None) -> None:
        """Load the blank image into the region (if configured), then reset its port."""
        if self.options.blank_image is not None:
            self.program(card, region, self.options.blank_image, None)
        node = self.access.dev_root / str(region.port)
        try:
            port_reset(self.access, node)
        except OSError as exc:
            raise FpgaError(f"{region.id}: DFL_FPGA_PORT_RESET on {node} failed: {exc}") from exc

    def verify(self, card: Card, region: Region, on_start: PidRecorder | None = None) -> None:
        """The region holds the blank image (``afu_id``), the card its static image (``bitstream_id``)."""
        if self.options.blank_afu_id is not None:
            found = self.afu_id(region)
            if found != self.options.blank_afu_id:
                raise FpgaError(
                    f"{region.id}: afu_id reads {found} after deprogramming, not the blank image's "
                    f"{self.options.blank_afu_id}"
                )
        if self.options.bitstream_id is not None:
            path = self._platform / str(card.fme) / "bitstream_id"
            try:
                found_id = int(self.access.read_text(path), 0)
            except (OSError, ValueError) as exc:
                raise FpgaError(f"{card.address}: cannot read {path}: {exc}") from exc
            if found_id != int(self.options.bitstream_id, 0):
                raise FpgaError(
                    f"{card.address}: bitstream_id reads {found_id:#x}, not the expected static image "
                    f"{self.options.bitstream_id}"
                )
        errors = self._read_error(self._platform / str(region.port) / "errors/errors")
        if errors:
            raise FpgaError(f"{region.id}: port errors/errors reads {errors:#x} after deprogramming")

    # --- power --------------------------------------------------------------------------

    def _power_max(self, card: Card) -> Path | None:
        hwmon = self._platform / str(card.fme) / "hwmon"
        try:
            for entry in self.access.listdir(hwmon):
                if self.access.read_text(hwmon / entry / "name") == "dfl_fme_power":
                    return hwmon / entry / "power1_max"
        except OSError:
            return None
        return None

    def power_save(self, card: Card) -> str | None:
        """Lower the card's ``power1_max`` to ``power_save_watts``; returns the value to restore."""
        watts = self.options.power_save_watts
        path = self._power_max(card)
        if watts is None or path is None:
            return None
        previous = self.access.read_text(path)
        self.access.write_text(path, str(watts * 1_000_000))
        return previous

    def power_restore(self, card: Card, previous: str) -> None:
        """Put the card's ``power1_max`` back."""
        path = self._power_max(card)
        if path is not None:
            self.access.write_text(path, previous)

    # --- health -------------------------------------------------------------------------

    def _read_error(self, path: Path) -> int:
        try:
            return int(self.access.read_text(path), 0)
        except (OSError, ValueError):
            return 0

    def problems(self, target: Target) -> list[str]:
        """Why the target is unhealthy: card or port gone, node gone, errors, temperature (empty: healthy)."""
        card = target.card
        fme_dir = self._platform / str(card.fme)
        if not self.access.exists(fme_dir):
            return [f"card {card.address} is gone ({card.fme} disappeared)"]
        found = []
        if target.whole and not self.access.exists(self.access.dev_root / str(card.fme)):
            found.append(f"device node {self.access.dev_root / str(card.fme)} is gone")
        for name in _FME_ERRORS:
            value = self._read_error(fme_dir / "errors" / name)
            if value:
                found.append(f"{card.fme} errors/{name} reads {value:#x}")
        limit = self.options.temperature_limit
        if limit is not None:
            celsius = self._temperature(fme_dir)
            if celsius is not None and celsius > limit:
                found.append(f"card temperature {celsius:g} C is above the limit {limit:g} C")
        for region in target.regions:
            port_dir = self._platform / str(region.port)
            if not self.access.exists(port_dir):
                found.append(f"{region.port} is gone")
                continue
            if not self.access.exists(self.access.dev_root / str(region.port)):
                found.append(f"device node {self.access.dev_root / str(region.port)} is gone")
            value = self._read_error(port_dir / "errors/errors")
            if value:
                found.append(f"{region.port} errors/errors reads {value:#x}")
        return found

    def _temperature(self, fme_dir: Path) -> float | None:
        hwmon = fme_dir / "hwmon"
        try:
            for entry in self.access.listdir(hwmon):
                if self.access.read_text(hwmon / entry / "name") == "dfl_fme_thermal":
                    return int(self.access.read_text(hwmon / entry / "temp1_input")) / 1000
        except (OSError, ValueError):
            return None
        return None
