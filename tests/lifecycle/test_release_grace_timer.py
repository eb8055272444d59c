"""A tenancy waiting out ``[liveness] unknown_grace`` is released when the grace ends, not at the next release pass.

Where the pods' cgroups cannot be read, a tenancy the kubelet no longer
attributes waits ``unknown_grace`` seconds from the moment its pod was seen
gone; a timer then starts its release. Before, only the reconciler's next look
did, a whole ``[release] interval`` after the first (issue 42: a 0.5 s grace
cost 1 s of the shared slot hand-over at the default interval).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"
#: The release passes' interval here: far longer than the grace, so a second pass cannot come before the timer.
INTERVAL = 4.0


def test_the_release_starts_when_unknown_grace_ends_with_no_second_look(lab: Lab, devplug_root: Path) -> None:
    """One release pass sees the pod's device unattributed while its liveness is unknown; the release follows it
    with no second pass (which the debug log would show as a second look at the device) in between."""
    unreadable = devplug_root / "no-cgroups-here"
    unreadable.mkdir()
    lab.start(
        {RESOURCE: lab.resource_table(count=1)},
        release_interval=INTERVAL,
        liveness={"cgroup_mount": str(unreadable), "unknown_grace": 0.5},
    )
    (device,) = lab.admit("p", 1)
    lab.wait(
        lambda: (lab.ledger_record(device) or {}).get("pod") == "default/p",
        timeout=30.0,
        what=f"a release pass to see pod p hold {device}",
    )
    lab.kubelet.remove_pod("p")
    lab.wait_released(device, timeout=30.0)
    log = lab.log()
    released_at = log.index(f"releasing {device}")
    looks = log[:released_at].count(f"{device}: the kubelet attributes them to no container any more")
    assert looks == 1, f"{looks} release passes looked at {device} before its release:\n{log[-4000:]}"
    releases = lab.wait(lambda: lab.resource_status()["recent_releases"], what="the release in the status")
    assert "unknown_grace" in releases[-1]["evidence"], releases
