"""A driver's folder watch that cannot do its job is said, and it comes back by itself (issue 36, item 8).

The mock's device folder replaced by a file stopped the core's folder watcher (``NotADirectoryError``): the
resource stayed at 0 devices after the folder came back, still registered, ``/readyz`` 200 and ``devplug status``
exit 0. Through a real daemon: the folder becomes a file, then a folder again; meanwhile ``/readyz`` answers 503 and
``devplug status`` exits 6, both naming the watch's problem; afterwards the devices are back and both say ready.
"""

from __future__ import annotations

import http.client
import shutil
import socket
from typing import Any

RESOURCE = "example.com/mock"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _readyz(port: int) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        return response.status, response.read().decode().strip()
    finally:
        conn.close()


def test_a_device_folder_replaced_by_a_file_is_said_and_its_devices_come_back(lab: Any) -> None:
    port = _free_port()
    lab.start({RESOURCE: lab.resource_table(count=2)}, metrics={"enabled": True, "port": port})
    folder = lab.mock_dir()
    lab.wait(lambda: _readyz(port) == (200, "ready") and lab.status_command().returncode == 0, 30, what="ready")

    shutil.rmtree(folder)
    folder.write_text("not a folder\n")
    _, text = lab.wait(lambda: (r := _readyz(port))[0] == 503 and "is not a folder" in r[1] and r, what="503")
    assert f"{RESOURCE}: the driver cannot follow its devices: {folder} is not a folder" in text, text
    # each look starts `devplug status` anew (a Python start-up, seconds on a loaded machine): a longer bound
    shown = lab.wait(lambda: (r := lab.status_command()).returncode == 6 and r, 30, what="devplug status to exit 6")
    assert f"PROBLEM: {RESOURCE}: the driver cannot follow its devices: {folder} is not a folder" in shown.stdout
    assert f"DRIVER PROBLEM: {folder} is not a folder" in shown.stdout, shown.stdout
    lab.wait(lambda: not lab.view().devices, what="no device advertised while there is no folder")

    folder.unlink()
    folder.mkdir()
    for device in ("mock0", "mock1"):
        (folder / device).write_text("")
    lab.wait(lambda: sorted(lab.view().healthy_ids) == ["mock0", "mock1"], what="the devices back")
    lab.wait(lambda: _readyz(port) == (200, "ready"), what="/readyz 200 again")
    lab.wait(lambda: lab.status_command().returncode == 0, 30, what="devplug status exit 0 again")
    assert lab.status()["resources"][0]["driver_problem"] is None
    (folder / "mock2").write_text("")  # the watch follows the folder again
    lab.wait(lambda: "mock2" in lab.view().healthy_ids, what="a device added after the folder came back")
