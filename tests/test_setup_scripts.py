"""The machine's set-up scripts pass on a fresh machine (issue 40, item 5): apt waits for another apt's locks.

A new VM runs unattended-upgrades, which holds apt's and dpkg's locks for minutes; an apt-get that does not wait
fails at once (``Could not get lock /var/lib/dpkg/lock-frontend``, exit 100) and ``make test`` with it. Every set-up
script calls apt through ``tools/apt-get``, which waits: these tests run it against a fake ``apt-get`` first on the
PATH that refuses the lock a few times, as apt 2.6 does for ``apt-get update``'s lists lock whatever
``DPkg::Lock::Timeout`` says.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRAPPER = ROOT / "tools" / "apt-get"
#: Every script that installs Debian packages for the tests, the image or CI.
SETUP_SCRIPTS = [
    ROOT / "tools" / "docs" / "setup.sh",
    ROOT / "tools" / "image" / "setup.sh",
    ROOT / "tools" / "vm" / "fetch-assets.sh",
    ROOT / ".ci" / "setup-etcd",
    ROOT / ".ci" / "setup-vm",
    ROOT / ".ci" / "setup-promtool",
]
LOCKED = "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)\n"

#: A fake apt-get: records its arguments, prints LOCKED and exits 100 while the ``refusals`` file counts down,
#: then does what ``outcome`` says (``ok`` or another error).
FAKE_APT = """#!/bin/sh
echo "$*" >> "{folder}/calls"
n=$(cat "{folder}/refusals")
if [ "$n" -gt 0 ]; then
  echo $((n - 1)) > "{folder}/refusals"
  printf '%s' "{locked}" >&2
  exit 100
fi
case "$(cat "{folder}/outcome")" in
  ok) echo "installed"; exit 0 ;;
  *) echo "E: Unable to locate package nosuchpackage" >&2; exit 100 ;;
esac
"""


def _fake_apt(folder: Path, refusals: int, outcome: str = "ok") -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "refusals").write_text(str(refusals))
    (folder / "outcome").write_text(outcome)
    fake = folder / "apt-get"
    fake.write_text(FAKE_APT.format(folder=folder, locked=LOCKED.strip()))
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{folder}:{os.environ['PATH']}", DEVPLUG_APT_LOCK_RETRY="0.05")
    return env


def _apt_get(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(WRAPPER), *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def _calls(folder: Path) -> list[str]:
    path = folder / "calls"
    return path.read_text().splitlines() if path.exists() else []


def test_apt_waits_for_a_lock_another_apt_holds_then_runs(tmp_path: Path) -> None:
    env = _fake_apt(tmp_path, refusals=3)
    result = _apt_get(env, "update", "-qq")
    assert result.returncode == 0, result.stderr
    calls = _calls(tmp_path)
    assert len(calls) == 4  # three refusals, then the run that got the lock
    assert all(re.search(r"-o DPkg::Lock::Timeout=\d+ ", c) for c in calls)  # dpkg's locks: apt waits itself
    assert int(re.findall(r"DPkg::Lock::Timeout=(\d+)", calls[0])[0]) == 600
    assert all(c.endswith("update -qq") for c in calls)
    assert result.stderr.count("waiting up to 600 s for another apt") == 1
    assert "/var/lib/apt/lists/lock" in result.stderr


def test_apt_gives_up_with_apts_own_error_once_the_deadline_passed(tmp_path: Path) -> None:
    env = _fake_apt(tmp_path, refusals=10**6)
    env["DEVPLUG_APT_LOCK_TIMEOUT"] = "1"
    result = _apt_get(env, "install", "-y", "graphviz")
    assert result.returncode == 100
    assert "Could not get lock /var/lib/apt/lists/lock" in result.stderr
    assert "still held the lock after 1 s (DEVPLUG_APT_LOCK_TIMEOUT)" in result.stderr
    assert 2 <= len(_calls(tmp_path)) < 200


def test_other_apt_failures_are_not_retried(tmp_path: Path) -> None:
    env = _fake_apt(tmp_path, refusals=0, outcome="missing")
    result = _apt_get(env, "install", "-y", "nosuchpackage")
    assert result.returncode == 100
    assert "Unable to locate package nosuchpackage" in result.stderr
    assert len(_calls(tmp_path)) == 1


_BARE_APT = re.compile(r"(^|[\s;&|(`])(apt-get|apt)\s+(-\S+\s+)*(install|update|upgrade|download|remove)\b")
_QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'")


def test_every_setup_script_calls_apt_through_the_waiting_wrapper() -> None:
    for script in SETUP_SCRIPTS:
        for number, line in enumerate(script.read_text().splitlines(), 1):
            code = _QUOTED.sub('""', line.split("#", 1)[0])  # messages may name apt-get
            assert not _BARE_APT.search(code), f"{script.relative_to(ROOT)}:{number} runs apt without tools/apt-get"
    makefile = (ROOT / "Makefile").read_text()
    assert not _BARE_APT.search(makefile)


def test_the_docs_set_up_is_a_no_op_when_graphviz_is_installed(tmp_path: Path) -> None:
    """``make test`` runs it every time: with dot there it neither needs root nor calls apt."""
    env = _fake_apt(tmp_path, refusals=0)
    dot = tmp_path / "dot"
    dot.write_text("#!/bin/sh\necho 'dot - graphviz version 2.42.2'\n")
    dot.chmod(0o755)
    result = subprocess.run(
        ["bash", str(ROOT / "tools" / "docs" / "setup.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert _calls(tmp_path) == []


def test_the_promtool_set_up_is_a_no_op_when_promtool_is_installed(tmp_path: Path) -> None:
    """``make test`` runs it every time too (issue 40, item 8): with promtool there, no apt and no root."""
    env = _fake_apt(tmp_path, refusals=0)
    promtool = tmp_path / "promtool"
    promtool.write_text("#!/bin/sh\necho 'promtool, version 2.42.0+ds'\n")
    promtool.chmod(0o755)
    result = subprocess.run(
        ["bash", str(ROOT / ".ci" / "setup-promtool")], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert _calls(tmp_path) == [] and "promtool, version 2.42.0+ds" in result.stderr


def test_make_test_sets_up_the_machine_before_the_tests_run() -> None:
    result = subprocess.run(
        ["make", "-n", "--no-print-directory", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    commands = result.stdout.splitlines()
    setup = next(i for i, c in enumerate(commands) if "tools/docs/setup.sh" in c)
    promtool = next(i for i, c in enumerate(commands) if ".ci/setup-promtool" in c)
    tests = next(i for i, c in enumerate(commands) if "/pytest" in c)
    assert setup < tests and promtool < tests
