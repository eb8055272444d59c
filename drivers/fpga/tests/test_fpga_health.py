"""Health through the DFL model: error registers, temperature, device nodes, a removed card; and recovery."""

from __future__ import annotations

from typing import Any

CARD = "0000:3b:00.0"
R0, R1 = f"{CARD}-region0", f"{CARD}-region1"


def test_errors_temperature_nodes_and_removal_make_devices_unhealthy_until_they_clear(lab: Any) -> None:
    card = lab.model.add_card(CARD, ports=2)
    lab.start(lab.dfl_options(temperature_limit=80.0), health_interval=0.05)

    def expect(r0: str, r1: str, what: str) -> None:
        lab.wait(lambda: (lab.health(R0), lab.health(R1)) == (r0, r1), what=what)

    expect("Healthy", "Healthy", "both regions healthy")
    lab.model.set_error(card.ports[0], "errors", 0x4)
    expect("Unhealthy", "Healthy", "region0 out on its port error")
    lab.model.set_error(card.ports[0], "errors", 0)
    expect("Healthy", "Healthy", "region0 back once the error cleared")

    lab.model.set_error(card.fme, "catfatal_errors", 0x1)
    expect("Unhealthy", "Unhealthy", "both out on a card error")
    lab.model.set_error(card.fme, "catfatal_errors", 0)
    expect("Healthy", "Healthy", "both back")

    lab.model.set_temperature(card.fme, 85_000)
    expect("Unhealthy", "Unhealthy", "both out above the temperature limit")
    assert "is unhealthy: card temperature 85 C is above the limit 80 C" in lab.log()
    lab.model.set_temperature(card.fme, 60_000)
    expect("Healthy", "Healthy", "both back when cooler")

    lab.model.remove_node(card.ports[1])
    expect("Healthy", "Unhealthy", "region1 out without its device node")
    lab.model.restore_node(card.ports[1])
    expect("Healthy", "Healthy", "region1 back with its node")

    lab.model.remove_card(CARD)
    expect("Unhealthy", "Unhealthy", "both out with the card removed (still listed)")
    assert "is gone" in lab.log()
