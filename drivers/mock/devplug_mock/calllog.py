"""The mock driver's record of hook calls: ``<directory>/.calls.jsonl``, kept by the kit's recorder.

Every call of ``preferred_allocation``, ``allocate``, ``pre_start``,
``post_stop`` and ``deallocate`` is appended by a
:class:`devplug.testing.recorder.HookRecorder` on the mock folder, after the
hook did its work, and noted in ``.calls.jsonl.started`` as it starts
(format and guarantees: :mod:`devplug.testing.recorder`).
``preferred_allocation`` also records ``must_include`` and ``size``; its
``device_ids`` are the available devices. :func:`read_calls` returns the raw
JSON objects; :func:`devplug.testing.recorder.read_hook_calls` returns typed records.
"""

from __future__ import annotations

from devplug.testing.recorder import CALLS_FILE
from devplug.testing.recorder import read_call_log as read_calls

__all__ = ["CALLS_FILE", "read_calls"]
