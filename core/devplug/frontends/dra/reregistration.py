"""Registering this instance again when a kubelet that keys DRA plugins by name has dropped it.

On such a kubelet (:mod:`~devplug.frontends.dra.kubeletrule`; 1.32 and earlier) the deregistration of *any*
instance of the driver drops whichever instance is registered under the driver's name, and wipes the node's
ResourceSlices of the driver at once (v1.32 ``DeRegisterPlugin(pluginName)``). So when another instance's
registration socket goes after this one registered -- a rolling update's old pod handing over, the old resource
of a live reload, a dead instance's socket someone removes -- the kubelet forgets *this* instance: it prepares
nothing more, and nothing reaches this instance to say so (no call, no word on its registration socket). What
this instance does see: the other socket go (the registry folder is watched) and its slices wiped (their watch).

:class:`Reregistration` then, on such a kubelet:

1. waits for evidence that the kubelet has run that deregistration: the wipe of the driver's slices, or at most
   :data:`SETTLE_S` (the kubelet's plugin reconciler runs every second, ``loopSleepDuration``, and runs the
   deregistration at once);
2. makes its registration socket afresh (:meth:`RegistrationServer.register_again`): the kubelet's watcher sees
   a new socket, its reconciler unregisters the old one (nothing is left under the name: "not necessary") and
   registers the new one (GetInfo, NotifyRegistrationStatus);
3. verifies: the kubelet's ``NotifyRegistrationStatus(registered)`` within :data:`VERIFY_S`. Until then the
   resource is registering (``/readyz`` 503; ``devplug status`` says why); a kubelet that does not confirm is said
   so in status and the log, and the socket is left for the kubelet's watcher.

A wipe seen while nothing was expected is a drop only if the kubelet does not register this instance of its own
accord within :data:`UNEXPECTED_WAIT_S` (a kubelet restart wipes every slice of the node, then registers the
sockets it finds). Wipes seen while a re-registration is under way are its own (the kubelet's deregistration of
the socket made afresh) and start nothing. On a kubelet keying plugins by endpoint (1.33 and later) nothing here
acts: a deregistration there removes that endpoint only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from devplug.frontends.dra.kubeletrule import KubeletRule
from devplug.frontends.dra.registration import RegistrationServer

__all__ = ["SETTLE_S", "UNEXPECTED_WAIT_S", "VERIFY_S", "Reregistration"]

log = logging.getLogger("devplug.frontends.dra")

#: The longest wait for the kubelet to run a deregistration it has reason to run (two and a half of its
#: reconciler's one-second periods, ``loopSleepDuration`` in ``pkg/kubelet/pluginmanager/plugin_manager.go``).
SETTLE_S = 2.5
#: How long the kubelet may take to register a socket made afresh (its reconciler's period, a dial, GetInfo,
#: the handler, NotifyRegistrationStatus; the dial alone may take 10 s, ``dialTimeoutDuration``).
VERIFY_S = 15.0
#: After a wipe nothing announced: how long the kubelet may take to register this instance of its own accord.
UNEXPECTED_WAIT_S = 2.0


class Reregistration:
    """One instance's recovery from being dropped by a kubelet keying DRA plugins by name (see the module)."""

    def __init__(
        self,
        registration: RegistrationServer,
        rule: KubeletRule,
        *,
        settle: float = SETTLE_S,
        verify: float = VERIFY_S,
        unexpected_wait: float = UNEXPECTED_WAIT_S,
    ) -> None:
        self.registration = registration
        self.rule = rule
        self._settle = settle
        self._verify = verify
        self._unexpected_wait = unexpected_wait
        self._wake = asyncio.Event()
        self._wiped = asyncio.Event()
        self._other_gone: str | None = None  # the other instance's socket whose removal drops this one
        self._busy = False  # a re-registration is under way: wipes are its own
        #: How many drops were handled, and the last one's account (for status).
        self.drops = 0
        self.last = ""

    # --- what the front end tells

    def other_gone(self, name: str) -> None:
        """Another instance's registration socket ``name`` was removed (by its instance, or by someone)."""
        if not self.rule.by_name or self.registration.state.registered is not True:
            return  # a kubelet keying by endpoint drops that endpoint only; an unregistered instance loses nothing
        self._other_gone = name
        self._wake.set()

    def slices_wiped(self) -> None:
        """Someone else deleted the node's slices of the driver (the kubelet wipes them when it deregisters)."""
        if self._busy:
            return
        self._wiped.set()
        self._wake.set()

    # --- the loop

    async def run(self) -> None:
        """Handle each drop as it is announced (see the module's docstring), until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self.rule.by_name or self.registration.state.registered is not True:
                self._wiped.clear()
                continue
            why = await self._dropped()
            if why is None:
                continue
            self._busy = True
            try:
                self.drops += 1
                await self.registration.register_again(why)
                confirmed = await self.registration.confirmed(self._verify)
                self.last = f"{why}: registered again, {'confirmed' if confirmed else 'not confirmed'} by the kubelet"
            finally:
                self._busy = False
                self._wiped.clear()
                self._wake.clear()

    async def _dropped(self) -> str | None:
        """Why the kubelet dropped this instance (after it has), or None when it did not."""
        rule = f"the kubelet ({self.rule.kubelet_version or 'version unknown'}) keys DRA plugins by name"
        if self._other_gone is None and self._wiped.is_set() and await self._registered_itself():
            log.info(
                "DRA driver %s: the node's slices were wiped and the kubelet registered this instance again itself "
                "(a kubelet restart)",
                self.registration.driver,
            )
            self._wiped.clear()
            return None
        gone, self._other_gone = self._other_gone, None
        if gone is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wiped.wait(), self._settle)
            seen = "it wiped the slices" if self._wiped.is_set() else f"no wipe seen in {self._settle:g} s"
            return f"the registration socket {gone} of another instance was removed and {rule} ({seen})"
        if not self._wiped.is_set():
            return None
        return (
            f"someone wiped the node's slices of the driver and the kubelet did not register this instance again "
            f"in {self._unexpected_wait:g} s; {rule}, so a deregistration under the name dropped it"
        )

    async def _registered_itself(self) -> bool:
        """After a wipe: whether the kubelet registers this instance of its own accord (GetInfo) within
        ``unexpected_wait`` seconds; False at once when another instance's socket is seen gone meanwhile (the
        wipe was that deregistration's)."""
        loop = asyncio.get_running_loop()
        calls = self.registration.state.get_info_calls
        deadline = loop.time() + self._unexpected_wait
        while loop.time() < deadline:
            if self.registration.state.get_info_calls > calls:
                return True
            if self._other_gone is not None:
                return False
            await asyncio.sleep(0.05)  # two facts from two sources; a short poll is simpler than a joint wait
        return False

    def describe(self) -> dict[str, object]:
        return {"drops_handled": self.drops, "last": self.last or None}
