"""A restarted mock (a daemon restart, a handover's new instance) keeps the device nodes an earlier start made.

Re-making them (unlink, mknod, chmod) cost half of ``list_devices`` on a 1,000-device folder at a handover's start,
while every call was held (issue 42); a node that is not what the mock makes is still made again.
"""

from __future__ import annotations

import os
from pathlib import Path

from devplug import DriverContext
from devplug.drivers import DriverHooks
from devplug.testing.sink import RecordingSink
from devplug_mock import NODE_FOLDER, MockDriver, MockOptions

RESOURCE = "example.com/mock"


def _list_once(directory: Path, state: Path) -> None:
    """One start of the mock: start, list (which makes the nodes), stop."""
    hooks = DriverHooks(RESOURCE, MockDriver(MockOptions(directory=directory, count=3)))
    sink = RecordingSink()
    hooks.start(DriverContext(RESOURCE, state, sink))
    try:
        sink.load(hooks.list_devices())
    finally:
        hooks.stop()


def test_a_second_start_keeps_the_nodes_the_first_made_and_remakes_a_wrong_one(tmp_path: Path) -> None:
    directory, state = tmp_path / "devices", tmp_path / "state"
    state.mkdir()
    _list_once(directory, state)
    nodes = directory / NODE_FOLDER
    os.link(nodes / "mock0", tmp_path / "mock0-link")  # the same inode while the link lives: a re-made node is not
    (nodes / "mock2").unlink()
    (nodes / "mock2").write_text("not a device node\n")  # not what the mock makes: made again
    os.chmod(nodes / "mock1", 0o600)  # nor is a node of another mode
    _list_once(directory, state)
    assert os.path.samefile(nodes / "mock0", tmp_path / "mock0-link")
    assert oct(os.lstat(nodes / "mock1").st_mode & 0o777) == oct(0o666)
    assert os.path.exists(nodes / "mock2") and not (nodes / "mock2").is_file()
