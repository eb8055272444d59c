"""Discovery handlers: tcp against real listening sockets on loopback, udev against this machine's udev."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from devplug.errors import ConfigError
from devplug_shared.discovery import DiscoveredDevice, build_handler, installed_handlers
from devplug_shared.discovery.tcp import TcpDiscovery, TcpOptions
from devplug_shared.discovery.udev import UdevDiscovery, UdevOptions, device_name

if TYPE_CHECKING:
    from conftest import Cluster


class Recorder:
    """Collects what a handler pushes."""

    def __init__(self) -> None:
        self.calls: list[dict[str, bool]] = []
        self._lock = threading.Lock()

    def __call__(self, devices: Sequence[DiscoveredDevice]) -> None:
        with self._lock:
            self.calls.append({d.name: d.available for d in devices})

    def last(self) -> dict[str, bool]:
        with self._lock:
            return self.calls[-1] if self.calls else {}


def test_the_wheel_publishes_its_handlers_in_their_own_entry_point_group() -> None:
    assert {"static", "tcp", "udev"} <= set(installed_handlers())
    with pytest.raises(ConfigError, match=r"no discovery handler 'onvif' is installed \(installed: static, tcp, udev"):
        build_handler({"handler": "onvif"}, "discovery")
    with pytest.raises(ConfigError, match=r"discovery.targetz: unknown key; did you mean 'targets'"):
        build_handler({"handler": "tcp", "targetz": {}}, "discovery")


def test_tcp_follows_sockets_that_open_and_close(
    wait_until: Callable[..., Any], unused_port: Callable[[], int]
) -> None:
    up = socket.create_server(("127.0.0.1", 0))
    down_port = unused_port()
    options = TcpOptions(
        targets={"up": f"127.0.0.1:{up.getsockname()[1]}", "down": f"127.0.0.1:{down_port}"},
        interval=0.05,
        timeout=0.5,
    )
    handler = TcpDiscovery(options)
    seen = Recorder()
    handler.start(seen)
    later = None
    try:
        assert {d.name: d.available for d in handler.devices()} == {"up": True, "down": False}
        assert handler.devices()[0].properties["address"] == options.targets["up"]
        later = socket.create_server(("127.0.0.1", down_port))  # the device appears
        wait_until(lambda: seen.last() == {"up": True, "down": True}, what="'down' to answer")
        up.close()  # the device stops answering
        wait_until(lambda: seen.last() == {"up": False, "down": True}, what="'up' to stop answering")
    finally:
        handler.stop()
        up.close()
        if later is not None:
            later.close()


def test_tcp_options_name_the_bad_key() -> None:
    with pytest.raises(ValueError, match=r"targets.cam: 'nowhere' is not host:port"):
        TcpOptions(targets={"cam": "nowhere"})
    with pytest.raises(ValueError, match=r"targets.Cam_1: device name 'Cam_1' must be"):
        TcpOptions(targets={"Cam_1": "10.0.0.1:80"})
    with pytest.raises(ValueError, match="interval"):
        TcpOptions(targets={"cam": "10.0.0.1:80"}, interval=0.0)


@pytest.mark.parametrize("store", ["local"], indirect=True)
def test_a_device_that_stops_answering_turns_its_slots_unhealthy(cluster: Cluster) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    discovery = {"handler": "tcp", "targets": {"plc": f"127.0.0.1:{port}"}, "interval": 0.05, "timeout": 0.5}
    node = cluster.add_node("node-a", discovery=discovery)
    try:
        assert node.health() == {"plc-0": "Healthy", "plc-1": "Healthy"}
        _, (slot,) = cluster.admit(node)
        pod = node.kubelet.pods()[0]
        assert pod.container("app").allocations["example.com/shared"].envs["DEVPLUG_SHARED_ADDRESS_PLC"] == (
            f"127.0.0.1:{port}"
        )
        listener.close()
        cluster.wait(lambda: set(node.health().values()) == {"Unhealthy"}, "plc's slots to turn unhealthy")
        listener = socket.create_server(("127.0.0.1", port))
        cluster.wait(lambda: set(node.health().values()) == {"Healthy"}, "plc's slots to be healthy again")
        assert cluster.holders() == {slot: "node-a"}, "an unanswering device keeps its claims"
    finally:
        listener.close()


def test_udev_names_devices_after_a_property() -> None:
    assert device_name("FTDI_FT232R_USB_UART_A50285BI") == "ftdi-ft232r-usb-uart-a50285bi"
    assert device_name("///") is None


def test_udev_matches_this_machines_devices_and_watches_for_more() -> None:
    pyudev = pytest.importorskip("pyudev")
    try:
        context = pyudev.Context()
        names = {d.properties.get("INTERFACE") for d in context.list_devices(subsystem="net")}
    except Exception as exc:  # no libudev: nothing to check against
        pytest.skip(f"udev unusable here: {exc}")
    if "lo" not in names:
        pytest.skip("no loopback interface in udev's view")
    handler = UdevDiscovery(UdevOptions(subsystem="net", match={"INTERFACE": "lo"}, name_property="INTERFACE"))
    handler.start(Recorder())
    try:
        assert [(d.name, d.available, d.properties["udev_name"]) for d in handler.devices()] == [("lo", True, "lo")]
    finally:
        handler.stop()
