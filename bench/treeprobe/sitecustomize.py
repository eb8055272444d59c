"""What a daemon child of ``bench.compare`` really ran: imported at its start-up (``site`` imports ``sitecustomize``
from the first folder of ``sys.path`` that has one; :mod:`bench.trees` puts this folder first on the child's
``PYTHONPATH``).

When ``DEVPLUG_BENCH_PROBE`` names a folder, the process writes ``<folder>/<pid>.json`` as it exits: its
``sys.argv`` and the file of every module of devplug and its drivers it imported (``devplug``, ``devplug.*``,
``devplug_*``). :func:`bench.trees.check_ran` then fails unless every one is in the tree the child was meant to
run. Standard library only, and only ``os``, ``sys`` and ``atexit`` at start-up (already imported by then, so it
costs the start-up it measures nothing measurable); runs in the other commit's daemon too, so it imports nothing of
devplug or of the benchmark.
"""

import atexit
import os
import sys

_FOLDER = os.environ.get("DEVPLUG_BENCH_PROBE")


def _ours(name: str) -> bool:
    return name == "devplug" or name.startswith(("devplug.", "devplug_"))


def _write_record() -> None:
    import json

    assert _FOLDER is not None
    modules = {}
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if _ours(name) and where:
            modules[name] = where
    record = {"pid": os.getpid(), "argv": sys.argv, "modules": modules}
    path = os.path.join(_FOLDER, f"{os.getpid()}.json")
    with open(path + ".tmp", "w") as out:
        json.dump(record, out)
    os.replace(path + ".tmp", path)


if _FOLDER:
    atexit.register(_write_record)
