"""The FPGA driver's options, checked when the config is (``devplug check-config``).

::

    [resources."example.com/fpga-region"]
    driver = "fpga"
    options = { backend = "dfl", mode = "regions", blank_image = "/opt/fpga/blank.gbs",
                blank_afu_id = "d8424dc4a4a3c413f89e433683f9040b" }

Every problem is a ``ValueError`` naming the key; the core turns it into a
config error naming the file and the resource too. See README "devplug-fpga"
for the table of options.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from devplug.host.sysfs import check_roots
from devplug.options import node_checks, refuse_kernel_trees

__all__ = ["Backend", "FpgaOptions", "Mode", "PLACEHOLDERS", "expand", "normal_afu_id"]

Backend = Literal["dfl", "command"]
Mode = Literal["whole", "regions", "both"]

#: The placeholders each command (or template) may use.
PLACEHOLDERS: dict[str, frozenset[str]] = {
    "program_command": frozenset({"address", "region", "bitstream"}),
    "deprogram_command": frozenset({"address", "region", "bitstream"}),
    "verify_command": frozenset({"address", "region"}),
    "power_save_command": frozenset({"address"}),
    "health_command": frozenset({"address"}),
    "device_nodes": frozenset({"address", "region"}),
}

_PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_AFU = re.compile(r"^[0-9a-f]{32}$")


def normal_afu_id(value: str, key: str) -> str:
    """An AFU ID as the kernel prints ``afu_id``: 32 lowercase hex digits (dashes and ``0x`` dropped)."""
    afu = value.strip().lower().removeprefix("0x").replace("-", "")
    if not _AFU.match(afu):
        raise ValueError(f"{key}: {value!r} is not an AFU ID (a UUID: 32 hex digits, dashes allowed)")
    return afu


def _fields(template: str, key: str) -> set[str]:
    try:
        return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise ValueError(f"{key}: {template!r} is not a valid template ({exc}); write a literal brace as {{{{") from exc


def _check_template(parts: tuple[str, ...], key: str) -> None:
    known = PLACEHOLDERS[key]
    for part in parts:
        for name in _fields(part, key):
            if name not in known:
                allowed = ", ".join("{" + k + "}" for k in sorted(known))
                raise ValueError(f"{key}: unknown placeholder {{{name}}} in {part!r}; {key} knows {allowed}")


def _check_program(argv: tuple[str, ...], key: str) -> None:
    program = argv[0]
    if "{" in program:
        raise ValueError(f"{key}: the program itself ({program!r}) may not hold a placeholder")
    if os.sep in program:
        refuse_kernel_trees(Path(program), key)  # /proc/self/exe and the like are executable files too
        if node_checks() and not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise ValueError(f"{key}: {program} is not an executable file")
    elif node_checks() and shutil.which(program) is None:  # the node's vendor tool (not there off the node)
        raise ValueError(f"{key}: {program!r} is not found on PATH ({os.environ.get('PATH', '')})")


def expand(argv: tuple[str, ...], **values: str) -> list[str]:
    """A command's argument list with its placeholders filled in (checked at config time)."""
    return [part.format(**values) for part in argv]


@dataclass(frozen=True)
class FpgaOptions:
    """Options of one FPGA resource (see the README for each key)."""

    backend: Backend = "dfl"
    mode: Mode = "regions"
    cards: tuple[str, ...] = ()
    regions_per_card: int = 1
    blank_image: Path | None = None
    blank_afu_id: str | None = None
    bitstream_id: str | None = None
    default_image: Path | None = None
    default_afu_id: str | None = None
    program_command: tuple[str, ...] = ()
    deprogram_command: tuple[str, ...] = ()
    verify_command: tuple[str, ...] = ()
    power_save_command: tuple[str, ...] = ()
    power_save_watts: int | None = None
    health_command: tuple[str, ...] = ()
    command_timeout: float = 300.0
    device_nodes: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()
    temperature_limit: float | None = None
    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    model_root: Path | None = None
    partitions: bool = False
    device_status: bool = False

    def __post_init__(self) -> None:
        if self.backend not in ("dfl", "command"):
            raise ValueError(f"backend: expected 'dfl' or 'command', got {self.backend!r}")
        if self.mode not in ("whole", "regions", "both"):
            raise ValueError(f"mode: expected 'whole', 'regions' or 'both', got {self.mode!r}")
        cards = tuple(c.strip().lower() for c in self.cards)
        for card in cards:
            if not _PCI.match(card):
                raise ValueError(f"cards: {card!r} is not a PCI address like '0000:3b:00.0'")
        if len(set(cards)) != len(cards):
            raise ValueError("cards: a card is listed twice")
        object.__setattr__(self, "cards", cards)
        if not 1 <= self.regions_per_card <= 64:
            raise ValueError(f"regions_per_card: must be 1 to 64, got {self.regions_per_card}")
        for key in ("blank_image", "default_image"):
            image = getattr(self, key)
            if image is not None:
                refuse_kernel_trees(Path(image), key)  # /proc/self/... "files" are files too
                if node_checks() and not Path(image).is_file():  # the node's file (not there off the node)
                    raise ValueError(f"{key}: {image} does not exist (or is not a file)")
        for key in ("blank_afu_id", "default_afu_id"):
            value = getattr(self, key)
            if value is not None:
                object.__setattr__(self, key, normal_afu_id(value, key))
        if self.bitstream_id is not None:
            try:
                int(self.bitstream_id, 0)
            except ValueError:
                raise ValueError(
                    f"bitstream_id: {self.bitstream_id!r} is not a number like '0x23000410010309'"
                ) from None
        for key in PLACEHOLDERS:
            value = tuple(getattr(self, key))
            object.__setattr__(self, key, value)
            _check_template(value, key)
            if value and key.endswith("_command"):
                _check_program(value, key)
        self._check_backend()
        if not math.isfinite(self.command_timeout) or not 0.1 <= self.command_timeout <= 86400:
            raise ValueError(f"command_timeout: must be 0.1 to 86400 seconds, got {self.command_timeout!r}")
        if self.temperature_limit is not None and not (
            math.isfinite(self.temperature_limit) and 0 < self.temperature_limit < 200
        ):
            raise ValueError(
                f"temperature_limit: must be degrees Celsius above 0 and below 200, got {self.temperature_limit!r}"
            )
        if self.power_save_watts is not None and not 0 <= self.power_save_watts <= 127:
            raise ValueError(f"power_save_watts: the DFL power threshold takes 0 to 127 W, got {self.power_save_watts}")
        for mount in self.mounts:
            if not mount.startswith("/"):
                raise ValueError(f"mounts: {mount!r} must be an absolute path")
            refuse_kernel_trees(Path(mount), "mounts")  # a container must not get /proc or /sys of the host
            if not os.path.isdir(mount):
                raise ValueError(f"mounts: {mount} does not exist (or is not a folder)")
        object.__setattr__(self, "mounts", tuple(self.mounts))
        check_roots(self.sysfs_root, self.dev_root)
        if self.model_root is not None:
            refuse_kernel_trees(self.model_root, "model_root")
        for key in ("partitions", "device_status"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key}: must be true or false, got {getattr(self, key)!r}")
        if self.partitions and self.mode == "whole":
            raise ValueError(
                "partitions: mode = 'whole' offers each card as one device, a part of nothing; "
                "partitions need mode = 'regions' or 'both'"
            )

    def _check_backend(self) -> None:
        uses_bitstream = any("{bitstream}" in part for part in self.deprogram_command)
        if uses_bitstream and self.blank_image is None:
            raise ValueError("deprogram_command: uses {bitstream} but no blank_image is set")
        if self.backend == "command":
            if not self.cards:
                raise ValueError("cards: the command backend needs the PCI addresses of its cards")
            if not self.deprogram_command:
                raise ValueError("deprogram_command: the command backend needs one (an argument list)")
            if self.default_image is not None and not self.program_command:
                raise ValueError("program_command: default_image is set, so a command to program it is needed")
            if self.power_save_watts is not None:
                raise ValueError("power_save_watts: only for the dfl backend; use power_save_command")
            return
        for key in ("program_command", "deprogram_command", "verify_command", "health_command", "device_nodes"):
            if getattr(self, key):
                raise ValueError(f"{key}: only for the command backend (backend = 'command')")
        if self.regions_per_card != 1:
            raise ValueError("regions_per_card: only for the command backend; the dfl backend reads the ports")
        if self.blank_image is not None and self.blank_afu_id is None:
            raise ValueError("blank_afu_id: blank_image is set, so the AFU ID it leaves must be given to verify it")
        if self.default_image is not None and self.default_afu_id is None:
            raise ValueError("default_afu_id: default_image is set, so its AFU ID must be given to verify it")
