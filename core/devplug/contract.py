"""The hook contract's version: which drivers this core can call.

The core speaks one version of the driver contract (the hooks of
:mod:`devplug.hookspecs`, their arguments, what they return, how they are
called), :data:`HOOK_CONTRACT`, as ``"MAJOR.MINOR"``. A driver class declares
the version it was written against as a literal class attribute::

    class FpgaDriver:
        hook_contract = "1.0"

The minor number grows when the core adds to the contract without breaking a
driver written before: a new optional hook, a new optional argument to a hook
(a driver that does not declare it is called without it; the shipped drivers
give theirs defaults, so a subclass calling ``super()`` the old way still
works), a new field with a default on a value type. The major number grows when
it changes or removes something a driver relies on. So the core calls a driver
whose contract has its own major number and a minor number no higher than its
own, and refuses any other when the driver is discovered
(:func:`check_hook_contract`, called by :meth:`devplug.drivers.DriverInfo.load`),
before any hook runs. A driver that declares no contract was written before the
attribute existed, against contract 1.0: it is called as such, with a warning
saying what to add. A change of major number comes with a new minor release of
the ``devplug`` distribution (0.1 -> 0.2), so a driver's ``devplug>=0.1,<0.2``
pin keeps pip from pairing them in the first place.
"""

from __future__ import annotations

import logging
import re

from devplug.errors import DriverLoadError

__all__ = [
    "CONTRACT_ATTRIBUTE",
    "HOOK_CONTRACT",
    "UNDECLARED_CONTRACT",
    "check_hook_contract",
    "declared_contract",
    "parse_contract",
    "undeclared_contract_warning",
]

log = logging.getLogger("devplug.drivers")

#: The contract this core speaks.
HOOK_CONTRACT = "1.1"

#: The contract of a driver that declares none: it was written before the attribute existed.
UNDECLARED_CONTRACT = "1.0"

#: The class attribute a driver declares its contract in.
CONTRACT_ATTRIBUTE = "hook_contract"

_FORMAT = re.compile(r"(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})")


def parse_contract(text: str) -> tuple[int, int]:
    """``"1.0"`` as ``(1, 0)``; :class:`ValueError` for anything but two dot-separated integers."""
    match = _FORMAT.fullmatch(text)
    if match is None:
        raise ValueError(f'{text!r} is not a contract version ("MAJOR.MINOR", e.g. {HOOK_CONTRACT!r})')
    return int(match.group(1)), int(match.group(2))


def undeclared_contract_warning(cls: type, driver: str, distribution: str, version: str) -> str | None:
    """The warning for a driver class that declares no contract (what it is called as, the line to add), or None
    when it declares one."""
    if getattr(cls, CONTRACT_ATTRIBUTE, None) is not None:
        return None
    return (
        f"driver {driver!r} from {distribution} {version}: class {cls.__qualname__} declares no hook contract: "
        f"called as a driver of hook contract {UNDECLARED_CONTRACT} (this devplug speaks {HOOK_CONTRACT}); set the "
        f"class attribute {CONTRACT_ATTRIBUTE} = {UNDECLARED_CONTRACT!r} to say so"
    )


def declared_contract(cls: type) -> object:
    """What a driver class declares as its contract: its ``hook_contract``, or :data:`UNDECLARED_CONTRACT` when it
    declares none (unchecked: :func:`check_hook_contract` checks it)."""
    declared = getattr(cls, CONTRACT_ATTRIBUTE, None)
    return UNDECLARED_CONTRACT if declared is None else declared


#: The drivers whose missing declaration was logged: once per process, however many resources use them.
_warned: set[tuple[str, str, str]] = set()


def check_hook_contract(cls: type, driver: str, distribution: str, version: str, *, warn: bool = True) -> None:
    """Refuse a driver class built for a contract this core does not speak.

    Called when a driver is discovered, before its hooks are looked at.
    :class:`DriverLoadError` names the driver, its distribution and version,
    the contract it declares (or that it declares none) and the one the core
    speaks, and says what to install. A class that declares none is taken as
    :data:`UNDECLARED_CONTRACT`, and the warning saying so
    (:func:`undeclared_contract_warning`) is logged once per process and
    driver (``warn=False``: not at all, for a caller that shows it itself).
    """
    where = f"driver {driver!r} from {distribution} {version}"
    core = parse_contract(HOOK_CONTRACT)
    warning = undeclared_contract_warning(cls, driver, distribution, version)
    key = (distribution, driver, cls.__qualname__)
    if warning is not None and warn and key not in _warned:
        _warned.add(key)
        log.warning("%s", warning)
    declared = declared_contract(cls)
    if not isinstance(declared, str):
        raise DriverLoadError(
            f"{where}: {cls.__qualname__}.{CONTRACT_ATTRIBUTE} must be a string like {HOOK_CONTRACT!r}, "
            f"got {declared!r}"
        )
    try:
        major, minor = parse_contract(declared)
    except ValueError as exc:
        raise DriverLoadError(f"{where}: {cls.__qualname__}.{CONTRACT_ATTRIBUTE}: {exc}") from exc
    if major == core[0] and minor <= core[1]:
        return
    if (major, minor) > core:
        advice = f"upgrade devplug to a release that speaks hook contract {major}.{minor}, or install a {distribution}"
    else:
        advice = f"install a {distribution}"
    raise DriverLoadError(
        f"{where} was built for hook contract {declared}, but this devplug speaks hook contract {HOOK_CONTRACT} "
        f"(it calls drivers built for {core[0]}.0 to {HOOK_CONTRACT}): {advice} release built for hook contract "
        f"{core[0]}.x"
    )
