"""A daemon that stops itself (SIGSTOP) right after a handover step, so a test can ``kill -9`` it exactly there.

Fault injection lives here, in the tests, and nowhere in the shipped daemon (issue 39): no variable of the
environment makes ``devplug run`` stop. A :class:`StoppingDaemon` is a :class:`~devplug.testing.process.DaemonProcess`
whose child runs this file instead of ``python -m devplug``::

    python tests/support/handoverstop.py STEP run --config CONFIG --log-level LEVEL

which installs an observer of the handover's steps (:func:`devplug.daemon.handover.observe_steps`) stopping the
process right after ``STEP``, then runs devplug's own main on the arguments after it, as ``python -m devplug``
does. The file is run by its path: the child needs nothing of the tests on its ``sys.path``.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from devplug.daemon.handover import NEW_INSTANCE_STEPS, OLD_INSTANCE_STEPS, observe_steps
from devplug.testing.process import DaemonProcess

__all__ = ["STEPS", "StoppingDaemon"]

#: The steps a daemon can stop at: the old instance's, then the new one's.
STEPS = (*OLD_INSTANCE_STEPS, *NEW_INSTANCE_STEPS)


class StoppingDaemon(DaemonProcess):
    """``devplug run`` in a child process that stops itself right after handover step ``at`` (then
    :meth:`stopped` is true; SIGCONT resumes it, SIGKILL is the crash the tests want there)."""

    def __init__(
        self,
        at: str,
        config_path: Path,
        log_path: Path,
        *,
        log_level: str = "debug",
        env: Mapping[str, str] | None = None,
    ) -> None:
        if at not in STEPS:
            raise ValueError(f"no handover step {at!r}: the steps are {', '.join(STEPS)}")
        super().__init__(config_path, log_path, log_level=log_level, env=env)
        self.at = at

    @classmethod
    def like(cls, process: DaemonProcess, at: str) -> StoppingDaemon:
        """A daemon as ``process`` (its config, log, log level and environment), stopping at ``at``."""
        return cls(at, process.config_path, process.log_path, log_level=process.log_level, env=process.env)

    def command(self) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), self.at, *self.run_arguments()]


def _stop_at(at: str) -> None:
    def observe(name: str) -> None:
        if name == at:
            os.kill(os.getpid(), signal.SIGSTOP)

    observe_steps(observe)


def main(argv: Sequence[str]) -> None:
    """``STEP ARGS...``: stop at ``STEP``, run ``devplug ARGS...``."""
    at, *args = argv
    if at not in STEPS:
        raise SystemExit(f"handoverstop: no handover step {at!r}: the steps are {', '.join(STEPS)}")
    _stop_at(at)
    from devplug.__main__ import main as devplug

    sys.argv = ["devplug", *args]
    devplug()


if __name__ == "__main__":
    main(sys.argv[1:])
