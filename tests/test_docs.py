"""The documentation keeps step with the code: every hook with its signature (the driver guide), every config key
(the configuration reference), every metric (the metrics reference), the modules of the architecture page, the
README's two commands, and the figures of record `make bench` leaves for the pages to quote."""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

from devplug import hookspecs
from devplug.config import _CDI, _KUBELET, _LIVENESS, _METRICS, _RELEASE, _RESOURCE, _SHUTDOWN, _STATE
from devplug.config.profiles import _PROFILE_KEYS
from devplug.drivers import HOOK_NAMES
from tests.support.metricfamilies import every_family

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
HOOKS = (ROOT / "docs" / "driver" / "hooks.md").read_text()
CONFIGURATION = (ROOT / "docs" / "operator" / "configuration.md").read_text()
METRICS = (ROOT / "docs" / "operator" / "metrics.md").read_text()
ARCHITECTURE = (ROOT / "docs" / "internals" / "architecture.md").read_text()
#: The packages whose every module the architecture page names, by the folder the page names them in.
ARCHITECTURE_PACKAGES = ("engine", "frontends/deviceplugin", "daemon", "drivers")


def test_every_hook_is_documented_with_its_signature() -> None:
    for name in HOOK_NAMES:
        signature = name + str(inspect.signature(getattr(hookspecs, name))).replace("'", "")
        assert f"`{signature.replace('|', chr(92) + '|')}`" in HOOKS or f"`{signature}`" in HOOKS, signature


def test_every_hookspec_is_in_the_hook_list() -> None:
    specs = {n for n, f in vars(hookspecs).items() if hasattr(f, f"{hookspecs.PROJECT_NAME}_spec")}
    assert specs == set(HOOK_NAMES)


def test_every_config_key_is_documented() -> None:
    tables = (
        ("kubelet", _KUBELET),
        ("state", _STATE),
        ("release", _RELEASE),
        ("liveness", _LIVENESS),
        ("shutdown", _SHUTDOWN),
        ("metrics", _METRICS),
        ("cdi", _CDI),
    )
    for table, keys in tables:
        for key in keys:
            assert f"`[{table}] {key}`" in CONFIGURATION, f"[{table}] {key}"
    for key in _RESOURCE:
        assert f"{key}`" in CONFIGURATION, key
    for key in ("[node] name", "[kubernetes] kubeconfig", "dra.driver_name", "dra.pool"):
        assert f"{key}`" in CONFIGURATION, key
    for key in _PROFILE_KEYS:
        assert f"`[profiles.<name>] {key}" in CONFIGURATION, f"[profiles.<name>] {key}"


def test_every_metric_is_in_the_metrics_table() -> None:
    families = every_family()
    process = [f for f in families if f.name.startswith("process_")]  # prometheus-client's, documented as a group
    assert process and "| `process_*` |" in METRICS
    families = [f for f in families if f not in process]
    # 27, the two handover metrics, the DRA front end's 15 (devplug.daemon.drametrics), issue 35's two (the
    # kubelet's call holds, the devices withheld while busy), and issue 41's claim device status writes
    assert len(families) == 47
    rows = {line.split("|")[1].strip(): line for line in METRICS.splitlines() if line.startswith("| `devplug_")}
    for family in families:
        name = f"{family.name}_total" if family.type == "counter" else family.name
        row = rows.pop(f"`{name}`", None)
        assert row is not None, f"{name} is not in the metrics reference's table (docs/operator/metrics.md)"
        cells = [c.strip() for c in row.split("|")]
        assert cells[2] == family.type, name
        labels = {label for sample in family.samples for label in sample.labels if label != "le"}
        assert {c.strip().strip("`") for c in cells[3].split(",")} - {""} == labels, name
    assert not rows, f"docs/operator/metrics.md lists metrics that do not exist: {sorted(rows)}"


def test_every_dra_prepare_failure_reason_is_explained() -> None:
    from devplug.frontends.dra.service import PREPARE_FAILURE_REASONS, UNPREPARE_FAILURE_REASONS

    lines = METRICS.splitlines()
    start = lines.index("| `reason` | the claim could not be prepared because |") + 2  # past the header's rule
    rows = lines[start : next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))]
    table = {reason.strip().strip("`") for row in rows for reason in row.split("|")[1].split(",")}
    assert set(PREPARE_FAILURE_REASONS) == table
    for reason in UNPREPARE_FAILURE_REASONS:
        assert f"`{reason}`" in METRICS, reason


def test_readme_starts_with_the_two_commands() -> None:
    head = README[:400]
    assert "make demo" in head and "make test" in head
    assert "Both work on a fresh clone" in README[:1000]


def test_the_architecture_page_names_every_module_of_the_core_and_only_modules_that_exist() -> None:
    package = ROOT / "core" / "devplug"
    for folder in ARCHITECTURE_PACKAGES:
        for module in sorted((package / folder).glob("*.py")):
            if module.name != "__init__.py":
                assert f"`{module.name}`" in ARCHITECTURE or f"{folder}/{module.name}" in ARCHITECTURE, (
                    f"docs/internals/architecture.md does not name {folder}/{module.name}"
                )
    # every path the page gives under a package of the core exists (engine/daemon.py moved to daemon/process.py)
    for folder, name in re.findall(
        r"\b((?:engine|daemon|drivers|frontends/deviceplugin)/)([a-z_]+\.py)\b", ARCHITECTURE
    ):
        assert (package / folder / name).is_file(), (
            f"docs/internals/architecture.md names {folder}{name}: no such module"
        )


def _bench(name: str) -> Any:
    """A module of the benchmark (bench/ is not installed: it runs from the checkout)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(name)


def test_make_bench_records_a_full_run_as_the_docs_figures(tmp_path: Path) -> None:
    """`make bench` ends with `python -m bench.record`, whose bench/record.json the docs quote (issue 40)."""
    record_module, report = _bench("bench.record"), _bench("bench.report")
    figures = {key.name: 1.5 for key in (*report.GOAL_KEYS, *report.CONTEXT_KEYS)}
    figures["idle_rss_mb"] = 44.5
    del figures[report.GOAL_KEYS[0].name]  # a key the run did not measure (as root-only ones are without root)
    results = {"machine": {"cpu_model": "Xeon", "cores": 2}, "quick": False, **figures}
    results_path = tmp_path / "results.json"
    report.write_results(results, results_path)
    out = tmp_path / "record.json"
    assert record_module.main([str(results_path), "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["machine"] == {"cpu_model": "Xeon", "cores": 2}
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", record["recorded"])
    assert [row["key"] for row in record["goals"]] == [key.name for key in report.GOAL_KEYS]
    assert record["goals"][0]["figure"] is None
    idle = next(row for row in record["goals"] if row["key"] == "idle_rss_mb")
    assert idle == {"key": "idle_rss_mb", "figure": 44.5, "goal": "<= 42", "met": False, "what": idle["what"]}
    assert [row["key"] for row in record["context"]] == [key.name for key in report.CONTEXT_KEYS]
    assert out.read_text() == record_module.dumps(record)  # one row a line
    # a --quick run's figures are refused, and so is a file that is no run's results
    report.write_results({**results, "quick": True}, results_path)
    assert record_module.main([str(results_path), "--out", str(out)]) == 1
    results_path.write_text("{}")
    assert record_module.main([str(results_path), "--out", str(out)]) == 1
    assert json.loads(out.read_text()) == record  # left as it was
    makefile = (ROOT / "Makefile").read_text()
    assert "\t$(BIN)/python -m bench\n\t$(BIN)/python -m bench.record\n" in makefile


def test_the_committed_record_has_every_row_the_docs_quote() -> None:
    record = json.loads((ROOT / "bench" / "record.json").read_text())
    assert {"recorded", "commit", "source", "machine", "goals", "context"} <= set(record)
    for row in record["goals"]:
        assert set(row) == {"key", "figure", "goal", "met", "what"}, row
    for row in record["context"]:
        assert set(row) == {"key", "figure", "what"}, row
