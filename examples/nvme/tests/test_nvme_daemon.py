"""The NVMe-like example driver in a real daemon: a failed erase keeps the drive out of service, for the kubelet
too, until the engine's retried release erases it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from devplug.devkubelet import ContainerSpec, DevKubeletThread, KubeletError, PodSpec
from devplug.testing.classsysfs import SysfsClassModel
from devplug.testing.fakecommand import FakeCommand
from devplug.testing.plugin import RunningDaemon
from devplug.testing.waiting import poll_until

EXAMPLE = Path(__file__).resolve().parent.parent  # where nvme_example.py is
RESOURCE = "example.com/nvme"


def test_a_failed_erase_keeps_the_drive_out_of_service_until_a_retry_erases_it(
    dev_kubelet: DevKubeletThread,
    devplug_daemon: Callable[..., RunningDaemon],
    sysfs_class_tree: SysfsClassModel,
    tmp_path: Path,
) -> None:
    sysfs_class_tree.add_device("nvme", "nvme0", {"state": "live"}, number=(240, 0))
    tool = FakeCommand(tmp_path / "tool", name="nvme")
    tool.behave(format={"exit": 5, "stderr": "NVMe status: ACCESS_DENIED"})
    dev_kubelet.dev_root = sysfs_class_tree.dev_root  # the container runtime finds /dev/nvme0 there
    options = {
        "sysfs_root": str(sysfs_class_tree.sysfs_root),
        "dev_root": str(sysfs_class_tree.dev_root),
        "erase_command": [str(tool.path), "format", "{device}", "--ses=1"],
        "erase_timeout": 20.0,
    }
    daemon = devplug_daemon(
        {RESOURCE: {"driver": "nvme-example", "options": options}},
        test_drivers={"nvme-example": "nvme_example:NvmeDriver"},
        python_path=[EXAMPLE],
    )

    def healthy() -> tuple[str, ...]:
        view = dev_kubelet.resource(RESOURCE)
        return view.healthy_ids if view is not None else ()

    pod = dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", {RESOURCE: 1})]))
    assert pod.container("c").devices[RESOURCE] == ("nvme0",)
    dev_kubelet.remove_pod("p")
    poll_until(lambda: tool.calls("format", "failed"), "a failed erase of nvme0", details=daemon.log_text)
    poll_until(lambda: not healthy(), "nvme0 advertised unhealthy after its failed erase", details=daemon.log_text)
    with pytest.raises(KubeletError, match="rejected"):
        dev_kubelet.admit_pod(PodSpec("q", [ContainerSpec("c", {RESOURCE: 1})]))
    assert not tool.calls("format", "done")

    tool.behave()  # the tool works again: the engine's next retry of the release erases the drive
    poll_until(lambda: tool.calls("format", "done"), "nvme0 erased by a retried release", details=daemon.log_text)
    poll_until(lambda: healthy() == ("nvme0",), "nvme0 healthy again", details=daemon.log_text)
    pod = dev_kubelet.admit_pod(PodSpec("r", [ContainerSpec("c", {RESOURCE: 1})]))
    assert pod.container("c").devices[RESOURCE] == ("nvme0",)
