"""The mock driver's record of hook calls: ``<directory>/.calls.jsonl``, kept by the kit's recorder.

Every call of ``preferred_allocation``, ``allocate``, ``pre_start``,
``post_stop`` and ``deallocate`` is appended by a
:class:`devplug.kit.hookrecord.HookRecorder` on the mock folder, after the
hook did its work, and noted in ``.calls.jsonl.started`` as it starts
(format and guarantees: :mod:`devplug.kit.hookrecord`).
``preferred_allocation`` also records ``must_include`` and ``size``; its
``device_ids`` are the available devices. :func:`read_calls` returns the raw
JSON objects; :func:`devplug.kit.hookrecord.read_hook_calls` (in tests:
:mod:`devplug.testing.recorder`) returns typed records.
"""

from __future__ import annotations

from devplug.kit.hookrecord import CALLS_FILE
from devplug.kit.hookrecord import read_call_log as read_calls

__all__ = ["CALLS_FILE", "read_calls"]
