"""Per-device serialization: one operation at a time on any device.

Allocate, PreStart, the KEP's PostStopContainer and Deallocate, and releases
found by the reconciler each hold the locks of every device they touch for
their whole run, so a Deallocate can never race an Allocate of the same device
and an Allocate waits for a release of its devices that is still running.
Locks are taken in sorted order, so two operations never deadlock. Each held
device also says what holds it (``activity``), for refusals that name it.

A driver hook abandoned at its ``hook_timeout`` may still be working on its
devices: the operation that called it hands their locks to the running call
(:meth:`DeviceLocks.keep_until`), so they stay locked, and no other hook
touches them, until the call really returns.

The type is devplug's one device lock, :mod:`devplug.kit.devicelocks`, which
drivers use through the kit (from their threads, with ``with``); the engine's
names are kept here.
"""

from __future__ import annotations

from devplug.kit.devicelocks import DeviceLocks, HeldLocks, LockTimeout

__all__ = ["DeviceLocks", "HeldLocks", "LockTimeout"]
