"""The commands the test kit adds to ``devplug`` (entry points ``devplug.cli``, which :mod:`devplug.cli.commands`
loads): ``devplug kubelet`` (the dev kubelet in the foreground, and ``admit|remove|restart|show`` talking to one)
and ``devplug demo``. They come with the ``devplug-testing`` distribution, never with the runtime.

Exit codes, as the core's (:mod:`devplug.cli.commands`): ``devplug demo`` exits 1 when the demo's lifecycle went
wrong; ``devplug kubelet admit|remove|restart|show`` exit 1 when the dev kubelet refused the request, 3 when no dev
kubelet answers. Nothing heavy is imported here: each command imports the dev kubelet or the demo when it runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

import click

from devplug.cli.run import EXIT_STATE, exit_code
from devplug.errors import DevplugError

if TYPE_CHECKING:
    from devplug.devkubelet.endpoints import EndpointKeying

__all__ = ["EXIT_DEMO_FAILED", "EXIT_KUBELET_REFUSED", "demo", "kubelet"]

#: ``devplug demo``: the demo's lifecycle went wrong.
EXIT_DEMO_FAILED = 1
#: ``devplug kubelet admit|remove|restart|show``: the dev kubelet refused the request or it failed.
EXIT_KUBELET_REFUSED = 1


def _fail(exc: DevplugError) -> NoReturn:
    click.echo(f"devplug: error: {exc}", err=True)
    sys.exit(exit_code(exc))


_DIR_OPTION = click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path),
    required=True,
    help="The dev kubelet's device-plugin folder (as given to `devplug kubelet --dir`).",
)
_CONTROL_OPTION = click.option(
    "--control-socket",
    type=click.Path(path_type=Path),
    default=None,
    help="The dev kubelet's control socket (default: DIR/../devkubelet.sock).",
)
_TIMEOUT_OPTION = click.option(
    "--timeout", type=float, default=120.0, show_default=True, help="Seconds to wait for the dev kubelet's answer."
)


def _kubelet_call(directory: Path, control_socket: Path | None, request: dict[str, Any], timeout: float) -> Any:
    """One request to a running ``devplug kubelet``; exits 3 when none answers, 1 when it refused the request."""
    from devplug.devkubelet.control import NoDevKubeletError, call, default_control_socket

    try:
        return call(control_socket or default_control_socket(directory), request, timeout)
    except NoDevKubeletError as exc:
        click.echo(f"devplug: error: {exc}", err=True)
        sys.exit(EXIT_STATE)
    except DevplugError as exc:
        click.echo(f"devplug: error: {exc}", err=True)
        sys.exit(EXIT_KUBELET_REFUSED)


def _requests(values: tuple[str, ...], what: str) -> dict[str, int]:
    """``RESOURCE=COUNT`` arguments as a request map (a bad one is a usage error naming it)."""
    requests: dict[str, int] = {}
    for value in values:
        resource, sep, count = value.rpartition("=")
        if not sep or not resource or not count.isdigit():
            raise click.BadParameter(f"{value!r}: expected RESOURCE=COUNT, e.g. example.com/mock=2", param_hint=what)
        requests[resource] = requests.get(resource, 0) + int(count)
    return requests


@click.group(invoke_without_command=True)
@click.option(
    "--dir", "directory", type=click.Path(path_type=Path), help="The device-plugin folder to serve kubelet.sock in."
)
@click.option("--kep", is_flag=True, help="Call PostStopContainer/Deallocate on pod removal (KEP mode).")
@click.option(
    "--pod-resources-socket",
    type=click.Path(path_type=Path),
    default=None,
    help="Where to serve PodResources (default: DIR/../pod-resources/kubelet.sock).",
)
@click.option(
    "--cgroups",
    type=click.Choice(["auto", "v1", "v2", "off"]),
    default="auto",
    show_default=True,
    help="Run containers as processes in cgroups of this version (auto: the host's, when root; off: no processes).",
)
@click.option(
    "--cgroup-driver",
    type=click.Choice(["cgroupfs", "systemd"]),
    default="cgroupfs",
    show_default=True,
    help="Name the cgroups as the kubelet's --cgroup-driver does.",
)
@click.option(
    "--endpoints-by",
    type=click.Choice(["socket-path", "resource-name"]),
    default="socket-path",
    show_default=True,
    help="Key device-plugin endpoints as kubelets with PR #135437 (1.36+) do, or by resource name as older ones.",
)
@click.option(
    "--check-device-nodes",
    is_flag=True,
    help="Refuse a container whose DeviceSpec host path is not a device node, as containerd does (the default from "
    "devplug 1.0; until then such a path is taken with a warning).",
)
@_CONTROL_OPTION
@click.pass_context
def kubelet(
    ctx: click.Context,
    directory: Path | None,
    kep: bool,
    pod_resources_socket: Path | None,
    cgroups: str,
    cgroup_driver: str,
    endpoints_by: str,
    check_device_nodes: bool,
    control_socket: Path | None,
) -> None:
    """Run the dev kubelet in the foreground (a stand-in for the kubelet's device manager), or talk to one.

    `devplug kubelet --dir DIR` serves Registration on DIR/kubelet.sock, PodResources and a control socket, and
    logs every event. From a second terminal, `devplug kubelet admit|remove|restart|show --dir DIR` admit and
    remove pods, restart it and show its devices, allocations, pods and events. They exit 1 when the dev kubelet
    refused the request (the message says why), 3 when no dev kubelet answers.
    """
    if ctx.invoked_subcommand is not None:
        given = [name for name in ("directory", "pod_resources_socket", "control_socket") if ctx.params[name]]
        changed = cgroups != "auto" or cgroup_driver != "cgroupfs" or endpoints_by != "socket-path"
        if given or kep or check_device_nodes or changed:
            raise click.UsageError(
                f"give the options after the subcommand: devplug kubelet {ctx.invoked_subcommand} --dir DIR ..."
            )
        return
    if directory is None:
        raise click.UsageError("Missing option '--dir' (the device-plugin folder to serve kubelet.sock in).")
    import logging
    import warnings

    from devplug.cli.logs import setup_logging
    from devplug.devkubelet import DeviceNodeDeprecationWarning, run_foreground

    setup_logging("info")
    # A container taken although its device path is no device node: said in the log, each time.
    warnings.simplefilter("always", DeviceNodeDeprecationWarning)
    logging.captureWarnings(True)

    async def serve(layout: Any) -> None:
        stop = asyncio.Event()  # SIGINT or SIGTERM: kill the containers and remove their cgroups, then exit 0
        for signum in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        await run_foreground(
            directory,
            kep_mode=kep,
            pod_resources_socket=pod_resources_socket,
            cgroups=layout,
            control_socket=control_socket,
            until=stop,
            endpoints_by=cast("EndpointKeying", endpoints_by),
            check_device_nodes=check_device_nodes,
        )

    try:
        asyncio.run(serve(_kubelet_cgroups(cgroups, cgroup_driver)))
    except DevplugError as exc:
        _fail(exc)


def _kubelet_cgroups(version: str, driver: str) -> Any:
    """The dev kubelet's :class:`~devplug.devkubelet.CgroupLayout` (None: no container processes)."""
    from devplug.devkubelet import CgroupLayout, CgroupsUnavailableError
    from devplug.devkubelet.cgroups import unique_cgroup_root
    from devplug.errors import ConfigError

    if version == "off":
        return None
    wanted = {"auto": None, "v1": 1, "v2": 2}[version]
    try:
        if os.geteuid() != 0:
            raise CgroupsUnavailableError("making cgroups needs root")
        return CgroupLayout.detect(wanted, root=unique_cgroup_root("devplug-kubelet"), driver=driver)
    except CgroupsUnavailableError as exc:
        if version != "auto":
            raise ConfigError(f"--cgroups {version}: {exc}") from exc
        click.echo(f"devplug kubelet: containers run without processes ({exc}); --cgroups off to say so", err=True)
        return None


@kubelet.command("admit")
@_DIR_OPTION
@click.argument("pod")
@click.argument("requests", nargs=-1, metavar="[RESOURCE=COUNT]...")
@click.option("--namespace", default="default", show_default=True)
@click.option("--init", "init", multiple=True, metavar="RESOURCE=COUNT", help="An init container asking for these.")
@click.option(
    "--grace", type=click.IntRange(min=0), default=30, show_default=True, help="terminationGracePeriodSeconds."
)
@click.option(
    "--stop-delay",
    type=click.FloatRange(min=0, max=3600),  # devkubelet.model.MAX_STOP_DELAY (not imported: the test kit's)
    default=0.0,
    help="Seconds the container takes to exit on SIGTERM (at most an hour; --trap-sigterm: never).",
)
@click.option(
    "--trap-sigterm", is_flag=True, help="The container ignores SIGTERM: only the grace period's SIGKILL ends it."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_CONTROL_OPTION
@_TIMEOUT_OPTION
def kubelet_admit(
    directory: Path,
    pod: str,
    requests: tuple[str, ...],
    namespace: str,
    init: tuple[str, ...],
    grace: int,
    stop_delay: float,
    trap_sigterm: bool,
    as_json: bool,
    control_socket: Path | None,
    timeout: float,
) -> None:
    """Admit pod POD with a container `main` asking for COUNT devices of each RESOURCE, as the kubelet does:
    GetPreferredAllocation, Allocate, PreStartContainer, then its containers start."""
    from devplug.devkubelet.controlview import format_pod

    containers: list[dict[str, Any]] = []
    if init:
        containers.append({"name": "init", "requests": _requests(init, "--init"), "init": True})
    containers.append(
        {"name": "main", "requests": _requests(requests, "RESOURCE=COUNT"), "stop_delay": stop_delay}
        | ({"ignore_sigterm": True} if trap_sigterm else {})
    )
    request = {"op": "admit", "pod": pod, "namespace": namespace, "containers": containers, "grace": grace}
    admitted = _kubelet_call(directory, control_socket, request, timeout)
    click.echo(json.dumps(admitted, indent=1) if as_json else format_pod(admitted))


@kubelet.command("remove")
@_DIR_OPTION
@click.argument("pod")
@click.option("--namespace", default="default", show_default=True)
@click.option(
    "--force", "how", flag_value="force", help="`kubectl delete --grace-period=0 --force`: forgotten at once."
)
@click.option("--static", "how", flag_value="static", help="A static pod's manifest removed: forgotten at once.")
@click.option("--finish", "how", flag_value="finish", help="Its containers end on their own; the pod object stays.")
@click.option("--no-wait", is_flag=True, help="Graceful removal: return once the termination began.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_CONTROL_OPTION
@_TIMEOUT_OPTION
def kubelet_remove(
    directory: Path,
    pod: str,
    namespace: str,
    how: str | None,
    no_wait: bool,
    as_json: bool,
    control_socket: Path | None,
    timeout: float,
) -> None:
    """Remove pod POD: gracefully by default (as `kubectl delete pod`, waiting until its containers are gone);
    --force and --static show the removal window (the kubelet forgets the pod while its containers still run)."""
    from devplug.devkubelet.controlview import format_removal

    request = {"op": "remove", "pod": pod, "namespace": namespace, "how": how or "graceful", "wait": not no_wait}
    result = _kubelet_call(directory, control_socket, request, timeout)
    click.echo(json.dumps(result, indent=1) if as_json else format_removal(result))


@kubelet.command("restart")
@_DIR_OPTION
@click.option(
    "--pod-list-delay",
    type=click.FloatRange(min=0, max=3600),  # devkubelet.model.MAX_POD_LIST_DELAY
    default=None,
    help="Seconds after the restart during which PodResources lists no pods (default 0).",
)
@_CONTROL_OPTION
@_TIMEOUT_OPTION
def kubelet_restart(directory: Path, pod_list_delay: float | None, control_socket: Path | None, timeout: float) -> None:
    """Restart the dev kubelet as a kubelet process restarts: plugins must register again, pods keep running."""
    result = _kubelet_call(directory, control_socket, {"op": "restart", "pod_list_delay": pod_list_delay}, timeout)
    click.echo(f"dev kubelet restarted ({result['restarts']} restart(s) so far); plugins must register again")


@kubelet.command("show")
@_DIR_OPTION
@click.argument("sections", nargs=-1, type=click.Choice(["kubelet", "devices", "allocations", "pods", "events"]))
@click.option("--events", "events", type=click.IntRange(min=0), default=20, show_default=True, help="How many events.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_CONTROL_OPTION
@_TIMEOUT_OPTION
def kubelet_show(
    directory: Path,
    sections: tuple[str, ...],
    events: int,
    as_json: bool,
    control_socket: Path | None,
    timeout: float,
) -> None:
    """Show the dev kubelet: SECTIONS of kubelet, devices, allocations, pods, events (default: all of them)."""
    from devplug.devkubelet.controlview import SHOW_SECTIONS, format_show

    shown = _kubelet_call(directory, control_socket, {"op": "show", "events": events}, timeout)
    click.echo(json.dumps(shown, indent=1) if as_json else format_show(shown, sections or SHOW_SECTIONS))


@click.command()
@click.option("--kep", is_flag=True, help="Have the dev kubelet call the KEP's PostStopContainer/Deallocate.")
@click.option("--keep", is_flag=True, help="Keep the temporary folder and print its path.")
@click.option("--profiles", is_flag=True, help="Instead: a node moving between per-node profiles as its labels change.")
@click.option(
    "--api",
    type=click.Choice(["device-plugin", "dra"]),
    default="device-plugin",
    show_default=True,
    help="The kubelet API: dra serves the mock driver as a DRA kubelet plugin (API server stand-in included).",
)
def demo(kep: bool, keep: bool, profiles: bool, api: str) -> None:
    """Watch the whole device lifecycle on config.example.toml, with a dev kubelet, in a temporary folder."""
    try:
        if profiles:
            from devplug.demo.profiles import run_profiles_demo

            sys.exit(0 if run_profiles_demo(keep=keep, echo=click.echo) else EXIT_DEMO_FAILED)
        if api == "dra":
            from devplug.demo.dra import run_dra_demo

            ok = run_dra_demo(keep=keep, echo=click.echo)
        else:
            from devplug.demo import run_demo

            ok = run_demo(kep_mode=kep, keep=keep, echo=click.echo)
    except DevplugError as exc:
        _fail(exc)
    sys.exit(0 if ok else EXIT_DEMO_FAILED)
