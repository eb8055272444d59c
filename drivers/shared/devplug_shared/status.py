"""``python -m devplug_shared.status --config FILE``: each shared slot's holder and lease age.

devplug's own ``devplug status`` does not show driver data yet, so each
shared resource's keeper writes ``shared-status.json`` in its driver state
folder (``<state dir>/resources/<domain>/<name>/driver/``) when anything
changes and at least every 30 s (times in it are unix seconds); this command reads it for every resource of the config
that uses the ``shared`` driver. ``--json`` prints the files as they are.
Exit codes: 0; 2 bad config; 3 no status file (is the daemon running?).
"""

from __future__ import annotations

import argparse
import json
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devplug import ConfigError
from devplug_shared.state import STATUS_FILE

__all__ = ["main", "render", "status_files"]


def status_files(config_path: Path) -> dict[str, Path]:
    """Every shared resource of the config, with where its status file is.

    A resource's driver state folder is ``<[state] dir>/resources/<domain>/<name>/driver`` (the README's
    driver guide, ``ctx.state_dir``); a relative ``[state] dir`` is relative to the config file.
    """
    try:
        data = tomllib.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{config_path}: cannot read the config: {exc}") from exc
    state = Path(data.get("state", {}).get("dir", "/var/lib/devplug"))
    if not state.is_absolute():
        state = config_path.parent / state
    resources = data.get("resources", {})
    return {
        name: state / "resources" / name.partition("/")[0] / name.partition("/")[2] / "driver" / STATUS_FILE
        for name, table in resources.items()
        if isinstance(table, dict) and table.get("driver") == "shared"
    }


def render(status: dict[str, Any], now: float | None = None) -> str:
    """One resource's status as text: the store line, then a row per slot with its holder and lease ages."""
    now = time.time() if now is None else now

    def ago(stamp: Any) -> str:
        return "-" if stamp is None else f"{max(0.0, now - float(stamp)):.1f}s"

    store = "ok" if status.get("store_ok") else f"UNREACHABLE for {ago(status.get('store_down_since'))}"
    lines = [
        f"{status.get('resource')}  node {status.get('node')}  store {status.get('store')}: {store}"
        f"  (written {ago(status.get('written'))} ago)"
    ]
    if status.get("store_error"):
        lines.append(f"  last error: {status['store_error']}")
    lines.extend(f"  CONFLICT: {conflict}" for conflict in status.get("conflicts", []))
    lines.append(f"  {'SLOT':<24} {'HEALTH':<10} {'HOLDER':<24} {'CLAIMED':>9} {'RENEWED':>9}")
    for slot in status.get("slots", []):
        holder = slot.get("holder") or "-"
        if not slot.get("available"):
            holder += " (device unavailable)"
        lines.append(
            f"  {slot['slot']:<24} {slot['health']:<10} {holder:<24} {ago(slot.get('since')):>9} "
            f"{ago(slot.get('renewed')):>9}"
        )
        if slot.get("kept"):
            lines.append(f"    {slot['kept']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devplug_shared.status", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="the daemon's config file")
    parser.add_argument("--json", action="store_true", help="print the status files as JSON")
    args = parser.parse_args(argv)
    try:
        files = status_files(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not files:
        print(f"{args.config}: no resource uses the shared driver", file=sys.stderr)
        return 0
    found: dict[str, Any] = {}
    missing = []
    for name, path in files.items():
        try:
            found[name] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            missing.append(f"{name}: no readable {path} ({exc}); is the daemon running?")
    if args.json:
        print(json.dumps(found, indent=1, sort_keys=True))
    else:
        for status in found.values():
            print(render(status))
    for problem in missing:
        print(problem, file=sys.stderr)
    return 3 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
