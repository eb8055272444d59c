"""Run a pytest selection inside a real Linux kernel in QEMU, and hand its result back.

::

    python tools/vm/run_guest.py --results DIR [--no-iommu] [--igb] [--timeout S] -- PYTEST_ARGS...

Boots ``.vm/vmlinux`` (see ``tools/vm/fetch-assets.sh``) with a busybox
initramfs on a q35 machine with a virtual Intel IOMMU and these PCI devices,
at fixed addresses the tests rely on:

* ``0000:00:03.0`` QEMU's ``edu`` device (1234:11e8): no kernel driver, alone in its group;
* ``0000:00:04.0`` an ``e1000e`` NIC (8086:10d3) bound to the e1000e driver, alone in its group;
* ``0000:00:05.0`` and ``0000:00:05.1``: two functions of a multi-function ``edu``
  device, which share one IOMMU group (conventional PCI has no ACS);
* ``0000:00:06.0`` an empty PCIe root port (a bridge, on pcieport), which vfio-pci's probe refuses;
* ``0000:02:00.0`` behind the root port ``0000:00:07.0``: an NVMe controller (1b36:0010, on the nvme
  driver) with SR-IOV, at most 4 virtual functions (``sriov_totalvfs``), each in its own IOMMU group;
* with ``--igb`` (QEMU >= 8.0, see :func:`has_igb`), ``0000:03:00.0`` behind the root port ``0000:00:08.0``:
  QEMU's Intel 82576 NIC (8086:10c9) on the kernel's igb driver, with SR-IOV (at most 7 VFs, 8086:10ca,
  driven by igbvf), its link on QEMU's user network with ``restrict=on`` (no host access, no outside
  traffic). Without ``--igb`` the machine is exactly as before, so the other suites' device lists hold.

The guest mounts the host's ``/`` read-only (9p) under a tmpfs overlay and
chroots into it, so ``<repo>/.venv/bin/pytest`` runs there with
``DEVPLUG_VM_GUEST=1`` in the environment, from the current folder. ``DIR``
(shared writable) receives ``junit.xml``, ``exit-code``, ``console.log`` and, in
``daemon-logs/``, the whole log of each daemon a failing test started
(``DEVPLUG_DAEMON_LOGS``, see :mod:`devplug.testing.plugin`).
The exit status is pytest's, or 100 when the guest never reported one.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VM_DIR = REPO / ".vm"
QEMU = "qemu-system-x86_64"
GUEST_RESULTS = "/devplug-vm-results"
#: The folder of ``DIR`` (``GUEST_RESULTS`` in the guest) that keeps the daemon logs of failing tests.
DAEMON_LOGS = "daemon-logs"
NO_RESULT = 100
#: QEMU's model of the Intel 82576 (``hw/net/igb.c``, QEMU 8.0 and later): an SR-IOV NIC on the kernel's igb.
IGB = "igb"


class _Cpio:
    """A minimal writer of the ``newc`` cpio format the kernel unpacks as initramfs."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.ino = 1

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> None:
        raw_name = name.encode() + b"\0"
        fields = [self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(raw_name), 0]
        self.ino += 1
        header = b"070701" + b"".join(f"{v:08x}".encode() for v in fields)
        self.parts.append(header + raw_name + b"\0" * (-(len(header) + len(raw_name)) % 4))
        self.parts.append(data + b"\0" * (-len(data) % 4))

    def directory(self, name: str) -> None:
        self._entry(name, stat.S_IFDIR | 0o755)

    def file(self, name: str, data: bytes, executable: bool = False) -> None:
        self._entry(name, stat.S_IFREG | (0o755 if executable else 0o644), data)

    def char_device(self, name: str, major: int, minor: int) -> None:
        self._entry(name, stat.S_IFCHR | 0o600, rdev=(major, minor))

    def tree(self, source: Path, target: str) -> None:
        for path in sorted(source.rglob("*")):
            name = f"{target}/{path.relative_to(source)}"
            if path.is_dir():
                self.directory(name)
            else:
                self.file(name, path.read_bytes())

    def bytes(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        return b"".join(self.parts)


def build_initramfs(out: Path) -> None:
    """Write an initramfs with busybox, the guest init and the extracted modules."""
    version = (VM_DIR / "kernel-version").read_text().strip()
    cpio = _Cpio()
    for d in ("bin", "dev", "proc", "sys", "lib", "lib/modules", "mnt", "tmp"):
        cpio.directory(d)
    cpio.char_device("dev/console", 5, 1)
    cpio.char_device("dev/null", 1, 3)
    cpio.file("bin/busybox", Path("/bin/busybox").read_bytes(), executable=True)
    cpio.file("init", (Path(__file__).parent / "guest_init.sh").read_bytes(), executable=True)
    modules = VM_DIR / "modules" / "lib" / "modules" / version
    cpio.directory(f"lib/modules/{version}")
    cpio.tree(modules, f"lib/modules/{version}")
    out.write_bytes(cpio.bytes())


def missing_assets() -> list[str]:
    """What is missing to boot the guest (empty when everything is there)."""
    missing = []
    if shutil.which(QEMU) is None:
        missing.append(f"{QEMU} (Debian package qemu-system-x86)")
    if not Path("/bin/busybox").is_file():
        missing.append("/bin/busybox (Debian package busybox-static)")
    if not (VM_DIR / "vmlinux").is_file() or not (VM_DIR / "kernel-version").is_file():
        missing.append(f"{VM_DIR}/vmlinux and modules (run tools/vm/fetch-assets.sh)")
    return missing


def qemu_devices() -> set[str]:
    """The device models this QEMU build has (``-device help``), empty when QEMU is missing or fails."""
    try:
        listing = subprocess.run(
            [QEMU, "-device", "help"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {line.split('"')[1] for line in listing.splitlines() if line.startswith('name "')}


def has_igb() -> bool:
    """Whether this QEMU emulates the 82576 (``-device igb``): QEMU 8.0 and later; Debian bookworm's 7.2 does not."""
    return IGB in qemu_devices()


def qemu_command(initramfs: Path, results: Path, iommu: bool, igb: bool = False) -> list[str]:
    """The QEMU command line for one guest run (``igb``: with the 82576 NIC, see the module docstring)."""
    append = "console=ttyS0 panic=-1 loglevel=4"
    machine = "q35"
    devices: list[str] = []
    if iommu:
        append += " intel_iommu=on iommu=pt"
        machine = "q35,kernel-irqchip=split"
        devices += ["-device", "intel-iommu,intremap=on"]
    devices += [
        "-device", "edu,addr=03.0",
        "-device", "e1000e,addr=04.0",
        "-device", "edu,addr=05.0,multifunction=on",
        "-device", "edu,addr=05.1",
        "-device", "pcie-root-port,id=rp6,bus=pcie.0,addr=06.0,chassis=6",
        # SR-IOV: QEMU requires the subsystem and both flexible-resource options (vq >= 2 x VFs, vi >= VFs).
        "-device", "pcie-root-port,id=rp7,bus=pcie.0,addr=07.0,chassis=7",
        "-device", "nvme-subsys,id=nvmesubsys0,nqn=devplug-sriov",
        "-device", "nvme,serial=devplugsriov,subsys=nvmesubsys0,bus=rp7,addr=00.0,sriov_max_vfs=4,"
        "sriov_vq_flexible=8,sriov_vi_flexible=4",
    ]  # fmt: skip
    if igb:
        devices += [
            "-device", "pcie-root-port,id=rp8,bus=pcie.0,addr=08.0,chassis=8",
            # The PF's link: QEMU's user network, restricted (no host access, no traffic leaves the guest).
            "-netdev", "user,id=igbnet,restrict=on",
            "-device", f"{IGB},netdev=igbnet,bus=rp8,addr=00.0",
        ]  # fmt: skip
    return [
        QEMU,
        "-machine", machine,
        "-accel", "tcg",
        "-cpu", "max",
        "-smp", "1",
        "-m", "1024",
        "-nodefaults",
        "-no-user-config",
        "-display", "none",
        "-serial", "stdio",
        "-no-reboot",
        "-kernel", str(VM_DIR / "vmlinux"),
        "-initrd", str(initramfs),
        "-append", append,
        *devices,
        "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        "-virtfs", f"local,path={results},mount_tag=results,security_model=none",
    ]  # fmt: skip


def run(results: Path, pytest_args: list[str], iommu: bool = True, timeout: float = 600.0, igb: bool = False) -> int:
    """Boot the guest once, run pytest there, return pytest's exit status (``igb``: with the 82576 NIC)."""
    missing = missing_assets()
    if missing:
        raise RuntimeError("cannot boot the test VM, missing: " + "; ".join(missing))
    if igb and not has_igb():
        raise RuntimeError(f"cannot boot the test VM with the igb NIC: {QEMU} has no '{IGB}' device (QEMU < 8.0)")
    results.mkdir(parents=True, exist_ok=True)
    for name in ("junit.xml", "exit-code", "console.log"):
        (results / name).unlink(missing_ok=True)
    shutil.rmtree(results / DAEMON_LOGS, ignore_errors=True)
    pytest = REPO / ".venv" / "bin" / "pytest"
    args = " ".join(shlex.quote(a) for a in pytest_args)
    (results / "cmd.sh").write_text(
        "cd " + shlex.quote(os.getcwd()) + "\n"
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root\n"
        "export DEVPLUG_VM_GUEST=1 PYTHONDONTWRITEBYTECODE=1\n"
        f"export DEVPLUG_DAEMON_LOGS={GUEST_RESULTS}/{DAEMON_LOGS}\n"
        f"{shlex.quote(str(pytest))} {args} --junitxml={GUEST_RESULTS}/junit.xml\n"
        f"echo $? > {GUEST_RESULTS}/exit-code\n"
    )
    with tempfile.TemporaryDirectory(prefix="devplug-vm-") as tmp:
        initramfs = Path(tmp) / "initramfs.cpio"
        build_initramfs(initramfs)
        with (results / "console.log").open("wb") as console:
            proc = subprocess.run(
                qemu_command(initramfs, results, iommu, igb),
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
    code_file = results / "exit-code"
    if not code_file.is_file():
        tail = (results / "console.log").read_text(errors="replace")[-3000:]
        print(f"run_guest: the guest reported no result (qemu exit {proc.returncode}):\n{tail}", file=sys.stderr)
        return NO_RESULT
    return int(code_file.read_text().strip() or NO_RESULT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, required=True, help="folder for junit.xml, exit-code, console.log")
    parser.add_argument("--no-iommu", action="store_true", help="boot without the virtual IOMMU")
    parser.add_argument("--igb", action="store_true", help="add the 82576 SR-IOV NIC (QEMU >= 8.0)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before the guest is killed")
    parser.add_argument("pytest_args", nargs="*", help="arguments for pytest in the guest (after --)")
    ns = parser.parse_args()
    started = time.monotonic()
    code = run(ns.results.resolve(), ns.pytest_args, iommu=not ns.no_iommu, timeout=ns.timeout, igb=ns.igb)
    print(f"run_guest: pytest exit {code} after {time.monotonic() - started:.1f} s", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
