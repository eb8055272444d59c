"""Why a DRA claim could not be prepared or unprepared: the kinds the metrics count, and the refusals found by the
service itself (:mod:`devplug.frontends.dra.service`).

Each prepare failure is told to the resource's observer with its kind
(:func:`prepare_failure_reason`, one of :data:`PREPARE_FAILURE_REASONS`), never with
its message or the claim: a fixed set, so the metrics' series stay few
(``docs/operator/metrics.md`` explains each; a test holds the two to each other).
"""

from __future__ import annotations

from collections.abc import Mapping

from devplug.errors import DeviceBusyError, DevplugError, DriverError, HookTimeoutError, RequestError, StateError
from devplug.frontends.dra.adminaccess import AdminAccessRefusedError
from devplug.frontends.dra.claims import (
    ClaimDeviceUnknownError,
    ClaimError,
    ClaimIdentifierError,
    ClaimNotAllocatedError,
    ClaimNotFoundError,
    ClaimPoolMismatchError,
    ClaimReadError,
    ClaimRef,
    ClaimReplacedError,
    NoDeviceOfOursError,
    OpaqueConfig,
)
from devplug.frontends.dra.shares import OverConsumedError, ShareError
from devplug.types import ClaimConfig

__all__ = [
    "PREPARE_FAILURE_REASONS",
    "UNPREPARE_FAILURE_REASONS",
    "ClaimRefused",
    "claim_config",
    "prepare_failure_reason",
]

_SOURCES = {"FromClass": "class", "FromClaim": "claim"}


class ClaimRefused(DevplugError):
    """A claim that cannot be prepared for a reason the service finds (held by another claim, changed since it was
    prepared, its CDI spec unwritable); ``reason`` is its kind, for the metrics."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


#: Why a claim could not be prepared, by the error's type (the first that matches; order matters: subclasses first).
_REASONS_BY_ERROR: tuple[tuple[type[BaseException], str], ...] = (
    (ClaimIdentifierError, "claim_identifier_invalid"),
    (ShareError, "share_invalid"),
    (OverConsumedError, "over_consumed"),
    (AdminAccessRefusedError, "admin_access_not_permitted"),
    (ClaimNotFoundError, "claim_not_found"),
    (ClaimReplacedError, "claim_replaced"),
    (ClaimNotAllocatedError, "claim_not_allocated"),
    (NoDeviceOfOursError, "no_device_of_driver"),
    (ClaimDeviceUnknownError, "device_not_published"),
    (ClaimPoolMismatchError, "devices_of_another_pool"),
    (ClaimError, "claim_invalid"),
    (ClaimReadError, "api_server_unavailable"),
    (DeviceBusyError, "device_busy"),
    (HookTimeoutError, "driver_timeout"),
    (DriverError, "driver_failed"),
    (StateError, "ledger_unwritable"),
    (RequestError, "device_not_servable"),
)
#: The reasons a claim is refused here (:class:`ClaimRefused`).
_REFUSALS = (
    "device_held_by_other_claim",
    "config_not_an_object",
    "being_unprepared",
    "allocation_changed",
    "cdi_spec_unwritable",
)
#: Every kind of prepare failure, as the metrics label them: a fixed set, so their series stay few.
PREPARE_FAILURE_REASONS = (
    *(reason for _, reason in _REASONS_BY_ERROR),
    *_REFUSALS,
    "refused",
    "internal_error",
)
#: Every kind of unprepare failure: the claim's UID, namespace or name is not of a form Kubernetes gives, the
#: release (a driver hook, the ledger) failed, or devplug did (a bug).
UNPREPARE_FAILURE_REASONS = ("claim_identifier_invalid", "release_failed", "internal_error")


def prepare_failure_reason(exc: BaseException) -> str:
    """The kind of a claim's prepare failure (one of :data:`PREPARE_FAILURE_REASONS`)."""
    if isinstance(exc, ClaimRefused):
        return exc.reason
    for error, reason in _REASONS_BY_ERROR:
        if isinstance(exc, error):
            return reason
    return "refused" if isinstance(exc, DevplugError) else "internal_error"


def claim_config(config: OpaqueConfig, claim: ClaimRef) -> ClaimConfig:
    """A driver's opaque configuration of the claim as the driver gets it; refused unless a JSON object."""
    if not isinstance(config.parameters, Mapping):
        raise ClaimRefused(
            f"{claim}: an opaque configuration ({config.source or 'no source'}) holds "
            f"{type(config.parameters).__name__} parameters; devplug drivers take a JSON object",
            "config_not_an_object",
        )
    return ClaimConfig(config.parameters, config.requests, _SOURCES.get(config.source, "claim"))
