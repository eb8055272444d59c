"""A driver's demo (``python -m devplug_<name>.demo``) in a temporary folder of its own, removed afterwards.

A demo builds a machine (a kernel model, a shared store), starts a dev kubelet
and the real daemon in a folder, runs a pod's lifecycle and says what it saw.
:func:`run_in_folder` gives it the folder and turns the outcome into an exit
status, the way every shipped driver's demo does::

    def main(argv=None):
        parser = argparse.ArgumentParser(prog="python -m devplug_nvme.demo")
        parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
        args = parser.parse_args(argv)
        return run_in_folder("dp-nvme-", lambda root: run_demo(root, print), keep=args.keep, logs="daemon.log",
                             echo=print, complain=lambda line: print(line, file=sys.stderr))

Nothing here prints: ``echo`` and ``complain`` are the demo's own output
(standard output and standard error).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["run_in_folder"]


def run_in_folder(
    prefix: str,
    run: Callable[[Path], object],
    *,
    keep: bool,
    logs: str,
    echo: Callable[[str], None],
    complain: Callable[[str], None],
    failures: tuple[type[BaseException], ...] = (TimeoutError, OSError),
) -> int:
    """Run ``run(folder)`` in a fresh folder under ``/tmp`` (short: unix socket paths must stay under 108 bytes);
    the exit status: 0 when it returned anything but False, 1 when it returned False or raised one of
    ``failures`` (said through ``complain``, with where the logs are: ``<folder>/<logs>``). The folder is removed
    afterwards, unless ``keep`` (then ``echo`` says where it is)."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        ok = run(root)
    except failures as exc:
        complain(f"demo failed: {exc}; logs: {root / logs}")
        return 1
    finally:
        if keep:
            echo(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if ok is not False else 1
