"""The hook-call recorder for driver authors (from :mod:`devplug.kit.hookrecord`, which ``devplug demo`` also reads).

A driver under test appends each hook call to ``<folder>/.calls.jsonl``
with :class:`HookRecorder`; tests read them back, typed, with
:func:`read_hook_calls`. :class:`~devplug.testing.conformance.DriverConformance`
observes a driver through this record.

Every name in :mod:`devplug.kit.hookrecord`'s ``__all__`` is here, under the one
list that module keeps (production code may not import the test kit, so the
record lives there and this module names it for tests).
"""

from devplug.kit import hookrecord
from devplug.kit.hookrecord import *  # noqa: F403  (the record's public names: the one list is hookrecord.__all__)

__all__ = hookrecord.__all__
