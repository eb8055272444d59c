"""``devplug status`` as a readable table."""

from __future__ import annotations

import json
import time
from typing import Any

from devplug.daemon.readiness import EXIT_NOT_RUNNING, Reason, exit_code, facts_from_status, reasons
from devplug.text.logsafe import escape

__all__ = ["format_status", "status_exit_code", "status_problems", "status_reasons"]


def status_reasons(data: dict[str, Any], now: float | None = None) -> list[Reason]:
    """Why the daemon whose status this is is not ready: what its ``/readyz`` says, by the same rules
    (:mod:`devplug.daemon.readiness`), the durations measured now."""
    resources, node = facts_from_status(data)
    return reasons(resources, node, now)


def status_problems(data: dict[str, Any]) -> list[str]:
    """What makes ``devplug status`` exit non-zero for a running daemon (:func:`status_exit_code`)."""
    return [reason.text for reason in status_reasons(data)]


def status_exit_code(data: dict[str, Any]) -> int:
    """``devplug status``'s exit code: 3 no daemon runs, 7 a resource can serve nothing, 6 another reason
    ``/readyz`` gives, 0 none (:mod:`devplug.daemon.readiness`)."""
    if not data.get("running"):
        return EXIT_NOT_RUNNING
    return exit_code(status_reasons(data))


def _ago(stamp: float | None) -> str:
    if not stamp:
        return "-"
    seconds = max(0.0, time.time() - stamp)
    if seconds < 90:
        return f"{seconds:.0f}s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def _clock(stamp: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(stamp))


def _profile_lines(profiles: dict[str, Any] | None) -> list[str]:
    """The node, its labels' source, the profiles running and why, and what was refused."""
    if not profiles:
        return []
    source = f" (from {profiles['node_source']})" if profiles.get("node_source") else ""
    api, detail = profiles.get("api"), profiles.get("api_detail") or ""
    lines = [f"node {profiles.get('node') or 'unknown'}{source}: labels {api}{': ' + detail if detail else ''}"]
    if not profiles.get("labels_read"):
        lines.append("  the node's labels were never read: serving the base config")
    active = profiles.get("active") or []
    reasons = profiles.get("reasons") or {}
    if active:
        lines.append("  profiles: " + ", ".join(f"{name} ({reasons.get(name) or 'chosen'})" for name in active))
    else:
        lines.append(f"  profiles: none, the base config (defined: {', '.join(profiles.get('defined') or []) or '-'})")
    if profiles.get("refused"):
        lines.append(f"  REFUSED (the running config stays): {profiles['refused']}")
    return lines


def _handover_lines(section: dict[str, Any]) -> list[str]:
    """The instance and its handovers (issue 30): from which instance to which, how long, what was handed over."""
    if not section.get("enabled"):
        return []
    lines = [f"instance {section.get('instance')} (handover enabled)"]
    for key, label in (
        ("took_over", "took the node over"),
        ("handing_over", "handing over"),
        ("last", "last handover"),
    ):
        record = section.get(key)
        if not isinstance(record, dict):
            continue
        took = record.get("took_s")
        lines.append(
            f"  {label}: {record.get('from')} -> {record.get('to')}, {record.get('state')}"
            + (f" in {took:.3f}s" if isinstance(took, (int, float)) else "")
            + (f" ({_ago(record.get('finished_at'))})" if record.get("finished_at") else "")
            + (f": {record.get('reason')}" if record.get("reason") else "")
        )
        for name, facts in (record.get("resources") or {}).items():
            if isinstance(facts, dict):
                lines.append(
                    f"    {name}: {facts.get('held_allocations', '?')} allocation(s) held, "
                    f"{facts.get('held_calls', 0)} call(s) held (longest {facts.get('longest_wait_s', 0)}s)"
                )
    return lines


def _dra_lines(frontend: dict[str, Any] | None) -> list[str]:
    """A resource served through DRA: its driver and pool, the kubelet's word on the registration, the slices, and
    each claim prepared here."""
    if not frontend or "driver" not in frontend:
        return []
    lines = [f"  DRA driver {frontend['driver']}, pool {frontend.get('pool')}, instance {frontend.get('instance')}"]
    reg = frontend.get("registration")
    if reg:
        said = {None: "not yet", True: "registered", False: "REFUSED"}[reg.get("registered")]
        error = f": {reg['error']}" if reg.get("error") else ""
        lines.append(f"    kubelet plugin watcher: {said}{error} (registrations {reg.get('registrations', 0)})")
        if reg.get("reregistrations"):
            confirmed = reg.get("reregistration_confirmed_s")
            lines.append(
                f"    registered again {reg['reregistrations']} time(s), last because {reg.get('reregistered_because')}"
                f" ({'not confirmed yet' if confirmed is None else f'confirmed in {confirmed} s'})"
            )
    kubelet = frontend.get("kubelet")
    if kubelet:
        lines.append(
            f"    kubelet {kubelet.get('kubelet_version') or '(version unknown)'} keys DRA plugins "
            f"{str(kubelet.get('plugin_keying', 'unknown')).replace('-', ' ')} (from {kubelet.get('learnt_from')})"
        )
    api = frontend.get("api")
    if api:
        taints = "used" if api.get("taints") else f"not used: {api.get('taints_reason')}"
        lines.append(
            f"    API {api.get('version')} (served {', '.join(api.get('served') or []) or '-'}), device taints {taints}"
        )
        for key, what in (("consumable_capacity", "consumable capacity"), ("partitionable", "counter sets")):
            if key in api:  # issue 41's forms, as discovery found the server
                used = "used" if api.get(key) else "not used"
                lines.append(f"    {what} {used}: {api.get(f'{key}_reason') or '-'}")
    sl = frontend.get("slices")
    if sl:
        state = "in sync" if sl.get("in_sync") else f"NOT IN SYNC ({sl.get('failures', 0)} failures in a row)"
        error = f": {sl['error']}" if sl.get("error") else ""
        lines.append(
            f"    ResourceSlices: {sl.get('slices', 0)}, generation {sl.get('generation', 0)}, {state}{error} "
            f"(last sync {_ago(sl.get('synced_at'))})"
        )
    claims = frontend.get("claims")
    if claims:
        lines.append(
            f"    claims: {claims.get('held', 0)} prepared now; since start {claims.get('prepared', 0)} prepared, "
            f"{claims.get('unprepared', 0)} unprepared, {claims.get('refused', 0)} refused"
        )
        for claim in claims.get("list") or []:
            pods = ", ".join(claim.get("pods") or []) or "-"
            lines.append(
                f"      {claim.get('claim')} (uid {claim.get('uid')}): {', '.join(claim.get('devices') or [])}; "
                f"pods {pods}"
            )
        for claim in claims.get("admin_access") or []:  # KEP-5018: prepared without a record or a hook
            devices = ", ".join(claim.get("devices") or [])
            lines.append(f"      {claim.get('claim')} (uid {claim.get('uid')}): admin access to {devices}")
    lines.extend(_claim_status_lines(frontend.get("claim_status")))
    return lines


def _claim_status_lines(cs: dict[str, Any] | None) -> list[str]:
    """The claims' device status (KEP-4817) the driver's ``allocate`` gave, once any was written or failed."""
    if not cs or not any(cs.get(k) for k in ("written", "removed", "failures", "invalid", "pending", "unsupported")):
        return []
    if cs.get("unsupported"):
        return [f"    claims' device status: NOT WRITTEN: {cs['unsupported']}"]
    last = f"; last failure: {cs['last_error']}" if cs.get("last_error") else ""
    return [
        f"    claims' device status: {cs.get('written', 0)} written, {cs.get('removed', 0)} removed, "
        f"{cs.get('pending', 0)} pending, {cs.get('failures', 0)} given up, {cs.get('invalid', 0)} refused as "
        f"invalid{last}"
    ]


def format_status(data: dict[str, Any]) -> str:
    """The status file's content as lines for a terminal (control characters in it escaped)."""
    state = "running" if data.get("running") else "NOT RUNNING (last status shown)"
    lines = [
        f"devplug daemon pid {data.get('pid')}: {state}, config {data.get('config') or '-'}; "
        f"status as of {_ago(data.get('written_at'))} (written within a second of each change)"
    ]
    for problem in status_problems(data) if data.get("running") else []:
        lines.append(f"  PROBLEM: {problem}")
    lines.extend(_profile_lines(data.get("profiles")))
    reload = data.get("reload") or {}
    if reload:
        lines.append(f"config generation {reload.get('generation')}, loaded {_ago(reload.get('loaded_at'))}")
        if reload.get("last_result") == "ok":
            changes = ", ".join(
                f"{what} {', '.join(reload.get(what) or []) or '-'}" for what in ("added", "changed", "removed")
            )
            lines.append(f"  last reload {_ago(reload.get('last_at'))}: applied ({changes})")
        elif reload.get("last_result") == "refused":
            lines.append(f"  last reload {_ago(reload.get('last_at'))}: REFUSED: {reload.get('last_error')}")
        if reload.get("trigger") and reload.get("last_result"):
            lines.append(f"    asked for by: {reload['trigger']}")
    lines.extend(_handover_lines(data.get("handover") or {}))
    release = data.get("release") or {}
    if release:
        err = release.get("last_error")
        since = release.get("failing_since")
        if err and since:
            failures = release.get("failures", 0)
            read = (
                f"PodResources ERROR {err}: unreadable since {_clock(since)} ({_ago(since)}, {failures} failed "
                f"read{'s' if failures != 1 else ''} since start; last good read {_ago(release.get('last_success'))})"
            )
        else:
            read = f"PodResources {'ERROR ' + err if err else 'ok'} (last read {_ago(release.get('last_success'))})"
        lines.append(
            f"release detection: every {release.get('interval')}s, grace {release.get('grace_period')}s, {read}"
        )
        if release.get("checkpoint_problem"):
            lines.append(f"  kubelet checkpoint: no evidence ({release['checkpoint_problem']})")
        liveness = release.get("liveness")
        if liveness:
            if liveness.get("state") == "unknown":
                required = " (REQUIRED)" if liveness.get("required") else ""
                lines.append(
                    f"  container liveness: unknown{required}: {liveness.get('problem')}; a pod that vanished is "
                    f"released {liveness.get('unknown_grace', '?')}s later"
                )
            else:
                lines.append(
                    f"  container liveness: {liveness.get('state')}, {liveness.get('driver')} driver, pods under "
                    f"{liveness.get('kubepods')}"
                )
        for waiting in release.get("awaiting_exit") or []:
            lines.append(
                f"  {waiting.get('resource')}: {', '.join(waiting.get('devices') or [])} wait for pod "
                f"{waiting.get('pod') or waiting.get('pod_uid') or '?'} to exit "
                f"(since {_ago(waiting.get('since'))}): {waiting.get('why')}"
            )
        for name, problem in (release.get("resource_errors") or {}).items():
            lines.append(f"  release detection for {name} failing: {problem}")
    for res in data.get("resources", []):
        counts = res.get("counts", {})
        lines.append("")
        lines.append(
            f"{res['name']}  driver={res['driver']}  state={res['state']}  registrations={res.get('registrations', 0)}"
        )
        if res.get("degraded"):
            lines.append(f"  DEGRADED: {res['degraded']}")
        if res.get("driver_problem"):
            lines.append(f"  DRIVER PROBLEM: {res['driver_problem']}")
        lines.extend(_dra_lines(res.get("frontend")))
        if res.get("last_error"):
            lines.append(f"  last error: {res['last_error']}")
        lines.append(
            "  devices: {devices} ({healthy} healthy, {unhealthy} unhealthy), {allocated} allocated, "
            "{releasing} releasing".format(
                **{k: counts.get(k, 0) for k in ("devices", "healthy", "unhealthy", "allocated", "releasing")}
            )
        )
        for dev in res.get("devices", []):
            flags = []
            if dev.get("allocated"):
                flags.append(f"allocated to {dev['pod']}" if dev.get("pod") else "allocated")
            if dev.get("releasing"):
                flags.append("releasing")
            numa = ",".join(str(n) for n in dev.get("numa_nodes", [])) or "-"
            if dev.get("reason"):
                flags.append(f"({dev['reason']})")
            lines.append(f"    {dev['id']:<24} {dev['health']:<10} numa={numa:<4} {' '.join(flags)}")
        sharing = res.get("sharing")
        if sharing:
            renamed = f", configured as {sharing['configured_as']}" if sharing.get("configured_as") else ""
            one = ", one replica per container" if sharing.get("fail_requests_greater_than_one") else ""
            lines.append(f"  sharing: {sharing.get('replicas', 1)} replicas per device{renamed}{one}")
            for share in sharing.get("devices", []):
                pods = ", ".join(share.get("pods") or []) or "-"
                releasing = f", {share['releasing']} releasing" if share.get("releasing") else ""
                lines.append(
                    f"    {share['device']:<24} {share['in_use']}/{share['replicas']} replicas in use, "
                    f"{share['tenants']} tenants{releasing}, pods {pods}"
                )
        for parent in res.get("partitions") or []:  # contract 1.1: parts sharing a parent's counters
            counters = ", ".join(
                f"{name} {parent.get('in_use', {}).get(name, 0)}/{total}"
                for name, total in sorted((parent.get("counters") or {}).items())
            )
            held = ", ".join(parent.get("held") or []) or "-"
            blocked = ", ".join(parent.get("blocked") or []) or "-"
            lines.append(f"  parent {parent.get('parent')}: {counters} in use; held {held}; withheld {blocked}")
            if parent.get("conflict"):
                lines.append(f"    CONFLICT: {parent['conflict']}")
        if res.get("state_error"):
            lines.append(f"  STATE WRITE FAILED: {res['state_error']} (Allocate is refused until it can write)")
        for devices, failure in (res.get("release_failures") or {}).items():
            lines.append(f"  release of {devices} failing: {failure}")
        for device, why in (res.get("busy_devices") or {}).items():
            lines.append(f"  BUSY {device}: {why}")
        for bad in res.get("quarantined_records") or []:
            named = ", ".join(bad.get("devices") or []) or "no devices"
            lines.append(
                f"  QUARANTINED ledger record #{bad.get('index')} (key {bad.get('key', '?')}; {named}): "
                f"{bad.get('reason')}; withheld until released through the driver, or `devplug quarantine clear`"
            )
        published = res.get("driver_status")
        if published:
            lines.append("  driver status:")
            for key, value in published.items():
                shown = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
                lines.append(f"    {key}: {escape(str(shown))[:1000]}")
        releases = res.get("recent_releases", [])
        if releases:
            lines.append("  recent releases:")
            for rel in releases:
                lines.append(
                    f"    {_ago(rel.get('finished_at')):>8}  {', '.join(rel['devices'])}  "
                    f"({rel['reason']}; took {rel['duration_s'] * 1000:.0f} ms)"
                )
                if rel.get("evidence"):
                    lines.append(f"              containers gone: {rel['evidence']}")
    return "\n".join(escape(line) for line in lines)
