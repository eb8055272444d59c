"""The kubelet's cgroup names, checked against the examples in the kubelet's own source (v1.32.10), and host detection.

No cgroup is made here: these are the names alone (``test_containers.py`` makes them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devplug.devkubelet.cgroups import CgroupDriver, CgroupLayout, CgroupsUnavailableError, Hierarchy, expand_slice

UID = "2fc932ce-fdcc-454b-97bd-aadfdeb4c340"
CONTAINER = "aaefb9d8feed2d453b543f6d928cede7a4dbefa6a0ae7c9b990dd234c56e93b9"
V1 = (Hierarchy(Path("/sys/fs/cgroup/cpu"), frozenset({"cpu"})), Hierarchy(Path("/sys/fs/cgroup/pids")))


def layout(driver: str, root: str = "/", version: int = 1) -> CgroupLayout:
    return CgroupLayout(version, root, CgroupDriver(driver), Path("/sys/fs/cgroup"), V1 if version == 1 else ())


def test_the_kubelets_own_examples() -> None:
    # cgroup_manager_linux.go, CgroupName.ToSystemd's comment
    name = ("kubepods", "burstable", "pod1234-abcd-5678-efgh")
    assert layout("systemd").literal(name) == (
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd_5678_efgh.slice"
    )
    # stats/cri_stats_provider.go, extractIDFromCgroupPath's comment: both drivers, a pod and its container
    systemd = layout("systemd")
    pod = systemd.pod_cgroup("burstable", UID)
    assert systemd.container_cgroup(pod, CONTAINER) == (
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod2fc932ce_fdcc_454b_97bd_aadfdeb4c340.slice/"
        f"cri-containerd-{CONTAINER}.scope"
    )
    cgroupfs = layout("cgroupfs")
    pod = cgroupfs.pod_cgroup("burstable", UID)
    assert cgroupfs.container_cgroup(pod, "9be25294016e") == f"/kubepods/burstable/pod{UID}/9be25294016e"


@pytest.mark.parametrize(
    ("qos", "cgroupfs", "systemd"),
    [
        ("guaranteed", "/dp-1/kubepods/pod{uid}", "/dp_1.slice/dp_1-kubepods.slice/dp_1-kubepods-pod{uid_}.slice"),
        (
            "burstable",
            "/dp-1/kubepods/burstable/pod{uid}",
            "/dp_1.slice/dp_1-kubepods.slice/dp_1-kubepods-burstable.slice/dp_1-kubepods-burstable-pod{uid_}.slice",
        ),
        (
            "besteffort",
            "/dp-1/kubepods/besteffort/pod{uid}",
            "/dp_1.slice/dp_1-kubepods.slice/dp_1-kubepods-besteffort.slice/dp_1-kubepods-besteffort-pod{uid_}.slice",
        ),
    ],
)
def test_qos_classes_under_a_cgroup_root(qos: str, cgroupfs: str, systemd: str) -> None:
    uid_ = UID.replace("-", "_")
    assert layout("cgroupfs", "/dp-1").pod_cgroup(qos, UID) == cgroupfs.format(uid=UID)
    assert layout("systemd", "/dp-1").pod_cgroup(qos, UID) == systemd.format(uid_=uid_)


def test_the_cgroups_the_kubelet_makes_at_start() -> None:
    assert layout("cgroupfs", "/a/b").kubelet_cgroups() == (
        "/a",
        "/a/b",
        "/a/b/kubepods",
        "/a/b/kubepods/burstable",
        "/a/b/kubepods/besteffort",
    )
    assert layout("systemd", "/dp").kubelet_cgroups() == (
        "/dp.slice",
        "/dp.slice/dp-kubepods.slice",
        "/dp.slice/dp-kubepods.slice/dp-kubepods-burstable.slice",
        "/dp.slice/dp-kubepods.slice/dp-kubepods-besteffort.slice",
    )


def test_paths_are_one_per_hierarchy() -> None:
    assert layout("cgroupfs", "/dp").paths("/dp/kubepods") == (
        Path("/sys/fs/cgroup/cpu/dp/kubepods"),
        Path("/sys/fs/cgroup/pids/dp/kubepods"),
    )
    v2 = CgroupLayout(2, "/dp", mount=Path("/sys/fs/cgroup/unified"))
    assert v2.paths("/dp/kubepods") == (Path("/sys/fs/cgroup/unified/dp/kubepods"),)
    assert v2.liveness_config() == {
        "cgroup_mount": "/sys/fs/cgroup/unified",
        "cgroup_root": "/dp",
        "cgroup_driver": "cgroupfs",
    }


def test_expand_slice_as_runc() -> None:
    assert expand_slice("-.slice") == "/"
    assert expand_slice("a.slice") == "/a.slice"
    assert expand_slice("a-b-c.slice") == "/a.slice/a-b.slice/a-b-c.slice"
    for bad in ("test--a.slice", "-test.slice", "a.scope", ".slice", "a/b.slice"):
        with pytest.raises(ValueError, match="invalid slice name"):
            expand_slice(bad)


def test_bad_layouts_are_refused() -> None:
    with pytest.raises(ValueError, match="cgroup version must be 1 or 2"):
        CgroupLayout(3, "/x")
    with pytest.raises(ValueError, match="absolute cgroupfs path"):
        CgroupLayout(2, "x")
    with pytest.raises(ValueError, match=r"must not contain \. or \.\."):
        CgroupLayout(2, "/x/../y")
    with pytest.raises(ValueError, match="needs its hierarchies"):
        CgroupLayout(1, "/x")
    with pytest.raises(ValueError, match="unknown pod QoS class 'gold'"):
        layout("cgroupfs").pod_cgroup("gold", UID)


HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset,clone_children
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
UNIFIED = "25 20 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n"


def test_detect_picks_v1_on_a_hybrid_host_and_v2_on_a_unified_one(tmp_path: Path) -> None:
    hybrid = tmp_path / "hybrid"
    hybrid.write_text(HYBRID)
    found = CgroupLayout.detect(mountinfo=hybrid, root="/dp")
    assert (found.version, found.mount, found.root) == (1, Path("/sys/fs/cgroup"), "/dp")
    assert [(h.path.name, sorted(h.controllers)) for h in found.hierarchies] == [
        ("cpu", ["cpu"]),
        ("cpuset", ["cpuset"]),
        ("systemd", ["name=systemd"]),
    ]
    assert [h.cpuset for h in found.hierarchies] == [False, True, False]
    asked = CgroupLayout.detect(2, mountinfo=hybrid, driver="systemd")
    assert (asked.version, asked.mount, asked.driver) == (2, Path("/sys/fs/cgroup/unified"), CgroupDriver.SYSTEMD)
    assert asked.root.startswith("/devplug-")
    unified = tmp_path / "unified"
    unified.write_text(UNIFIED)
    assert CgroupLayout.detect(mountinfo=unified).mount == Path("/sys/fs/cgroup")
    with pytest.raises(CgroupsUnavailableError, match="no cgroup v1 hierarchy is mounted under /sys/fs/cgroup"):
        CgroupLayout.detect(1, mountinfo=unified)


def test_detect_without_cgroups(tmp_path: Path) -> None:
    empty = tmp_path / "mountinfo"
    empty.write_text("22 1 0:21 / /proc rw - proc proc rw\n")
    with pytest.raises(CgroupsUnavailableError, match="no cgroup2 file system is mounted"):
        CgroupLayout.detect(2, mountinfo=empty)
    with pytest.raises(CgroupsUnavailableError, match="cannot read"):
        CgroupLayout.detect(mountinfo=tmp_path / "missing")
