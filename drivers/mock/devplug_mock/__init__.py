"""devplug-mock: a devplug driver whose devices are files in a folder.

Configure it with::

    [resources."example.com/mock"]
    driver = "mock"
    options = { directory = "/var/run/devplug/mock", count = 4 }

Each regular file in ``directory`` (not starting with ``.``) is a device named
after the file; its lines can make it unhealthy, put it on a NUMA node, or
make hooks fail or hang (:mod:`devplug_mock.devicefile`). Adding, removing or
editing a file reaches the kubelet at once. Every allocation-related hook call
is appended to ``<directory>/.calls.jsonl``; read it with :func:`read_calls`.

A container gets each device as a real character device (container runtimes
refuse anything else): ``<directory>/.dev/<id>``, which the driver makes with
the number of ``/dev/null`` when it may (``CAP_MKNOD``). Where it may not,
every device is handed out as the node the ``device_node`` option names
(``options = { directory = "...", device_node = "/dev/zero" }``), by default
``/dev/null``, with one warning.

For DRA's words of contract 1.1 (issue 41), three options, off by default
(:mod:`devplug_mock.features`): ``partitions`` (devices as parts of parents
with counters), ``share_capacity`` (the capacity a shared device is offered
with) and ``device_status`` (the status ``allocate`` returns per device:
``"ready"``, ``"network"``, or ``"invalid"`` for a status the API server
refuses)::

    options = { directory = "/var/run/devplug/mock", device_status = "network",
                partitions = [{ parent = "card0", counters = { regions = 4 }, whole = "card0-whole", parts = 4 }],
                share_capacity = { name = "memory", per_replica = 4294967296 } }
"""

from __future__ import annotations

from devplug_mock.calllog import CALLS_FILE, read_calls
from devplug_mock.devicefile import DIRECTIVE_HOOKS
from devplug_mock.driver import NODE_FOLDER, MockDriver, MockOptions

__all__ = ["CALLS_FILE", "DIRECTIVE_HOOKS", "NODE_FOLDER", "MockDriver", "MockOptions", "read_calls"]
