"""The hook-call recorder for driver authors (from :mod:`devplug.hookrecord`, which ``devplug demo`` also reads).

A driver under test appends each hook call to ``<folder>/.calls.jsonl``
with :class:`HookRecorder`; tests read them back, typed, with
:func:`read_hook_calls`. :class:`~devplug.testing.conformance.DriverConformance`
observes a driver through this record.
"""

from __future__ import annotations

from devplug.hookrecord import (
    CALLS_FILE,
    RELEASE_HOOKS,
    STARTED_SUFFIX,
    HookCall,
    HookRecorder,
    read_call_log,
    read_hook_calls,
)

__all__ = [
    "CALLS_FILE",
    "RELEASE_HOOKS",
    "STARTED_SUFFIX",
    "HookCall",
    "HookRecorder",
    "read_call_log",
    "read_hook_calls",
]
