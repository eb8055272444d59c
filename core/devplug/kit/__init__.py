"""The driver kit: what drivers share instead of writing it again each.

* :mod:`devplug.kit.command` -- running an external command (a vendor tool): no
  shell, its own session, a deadline that kills its whole process group, output
  read with a cap, a bounded excerpt for errors and logs.

Public for third-party drivers like the rest of :data:`devplug.PUBLIC_MODULES`.
"""

from __future__ import annotations

from devplug.kit.command import CommandError, CommandResult, StartRecorder, run_command

__all__ = ["CommandError", "CommandResult", "StartRecorder", "run_command"]
