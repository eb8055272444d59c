"""SysfsFiles, the base of the file-backed kernel models, is a whole SysfsAccess: reads as a host's, and the writes
of plain attributes as sysfs treats them (EACCES for a read-only one, even for root)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from devplug.host.sysfs import SysfsAccess
from devplug.testing.sysfsfiles import SysfsFiles


class _Model(SysfsFiles):
    """A model of one's own: a ``reset`` attribute whose write does something."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.resets = 0

    def write_text(self, path: Path, data: str) -> None:
        if path.name == "reset":
            self.resets += 1
        else:
            super().write_text(path, data)


def test_a_model_on_sysfsfiles_is_a_sysfs_access(tmp_path: Path) -> None:
    folder = tmp_path / "sys" / "devices" / "d0"
    folder.mkdir(parents=True)
    (folder / "name").write_text("d0\n")
    (folder / "name").chmod(0o444)
    (folder / "state").write_text("idle\n")
    (folder / "state").chmod(0o644)
    access: SysfsAccess = _Model(tmp_path)  # typed as one under mypy, checked as one at run time
    assert isinstance(access, SysfsAccess)
    assert access.read_text(folder / "name") == "d0"
    assert not access.writable(folder / "name") and access.writable(folder / "state")
    assert not access.writable(folder / "absent")
    with pytest.raises(PermissionError) as refused:
        access.write_text(folder / "name", "x")
    assert refused.value.errno == errno.EACCES and refused.value.filename == str(folder / "name")
    with pytest.raises(FileNotFoundError):
        access.write_text(folder / "absent", "x")
    access.write_text(folder / "state", "busy")
    assert access.read_text(folder / "state") == "busy"
    assert access.writable(folder / "state")  # the mode is kept
    access.write_text(folder / "reset", "1")
    assert isinstance(access, _Model) and access.resets == 1
