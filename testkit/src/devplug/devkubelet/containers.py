"""The container runtime, as a model: every container a real process in a real cgroup.

Stands for containerd 1.6 with runc under the kubelet of Kubernetes v1.32.10.
With a :class:`~devplug.devkubelet.cgroups.CgroupLayout`, each container (and
each pod's sandbox) is a ``/bin/sh`` process that joins its container cgroup
in every hierarchy before it does anything else (runc puts the container's
init into its cgroups before it execs the workload); :meth:`ContainerRuntime.start`
returns once it is in. Without a layout nothing runs: containers are names
with a state, and stopping one is instant.

What each behaviour follows:

* **Creation** (``CreateContainer``): the container's ``DeviceSpec`` host
  paths must be device nodes (:mod:`~devplug.devkubelet.devicespecs`,
  containerd's ``WithDevices``); otherwise the creation fails with
  containerd's text, nothing runs and no cgroup is made. Until devplug 1.0
  only where the check was asked for (``check_device_nodes``, or a
  ``dev_root`` other than ``/dev``); elsewhere such a path is taken with a
  :class:`~devplug.devkubelet.devicespecs.DeviceNodeDeprecationWarning`. Each creation gets a
  fresh 64-hex-digit ID, as containerd's ``util.GenerateID``.
* **Cgroups**: the container's cgroup is ``<pod cgroup>/<id>``, or the scope
  ``cri-containerd-<id>.scope`` under a systemd pod slice (containerd's
  ``getCgroupsPath``); the sandbox gets one the same way
  (``sandbox_run_linux.go``).
* **Stopping** (containerd's ``stopContainer`` in
  ``pkg/cri/server/container_stop.go``): with a timeout, SIGTERM to the
  container's init, a wait of up to that timeout for it to exit, then
  SIGKILL; the sandbox is stopped with SIGKILL at once
  (``stopSandboxContainer`` in ``sandbox_stop.go``).
* **The rest of a container's processes** die with its init: the init is
  PID 1 of the container's PID namespace, and the kernel kills every other
  process of a namespace when its init exits (``pid_namespaces(7)``). The
  model does it on the init's exit with ``cgroup.kill`` (v2) or a SIGKILL
  to every PID in ``cgroup.procs`` (v1).
* **The container's cgroup** goes once its processes are gone: containerd's
  event monitor deletes the task on exit (``handleContainerExit`` in
  ``pkg/cri/server/events.go``), and ``runc delete`` removes the cgroup.
* **Signals**: how a container reacts to SIGTERM is its
  :attr:`~devplug.devkubelet.model.ContainerSpec.stop_delay`: it exits that
  many seconds after SIGTERM; ``math.inf`` ignores it (as an init without a
  SIGTERM handler does: the kernel does not deliver it to a namespace's init,
  ``pid_namespaces(7)``), so only the SIGKILL at the end of the grace period
  ends it. A plain init container runs to completion (exit 0) at once; an app
  container or sidecar runs until it is told to finish (exit 0) or killed.
* Every container holds the read end of a pipe from this process and exits
  when it closes, so nothing outlives a test process that dies.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import logging
import math
import os
import secrets
import signal
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from devplug.devkubelet.cgroups import CgroupFs, CgroupLayout
from devplug.devkubelet.devicespecs import RuntimeDeviceError, check_device_specs
from devplug.errors import KubeletError

__all__ = ["ContainerCreateError", "ContainerRuntime", "RuntimeContainer"]

_log = logging.getLogger("devplug.devkubelet")

#: How long a process may take to join its cgroups and say it is ready.
_START_TIMEOUT = 30.0
#: How long the processes of a killed cgroup may take to be gone.
_GONE_TIMEOUT = 10.0

# $1: role (app, init, pause); $2: what SIGTERM does (a delay in seconds, or "ignore"); then cgroup.procs files.
_SCRIPT = r"""
role=$1 term=$2
shift 2
for procs; do echo $$ >"$procs" || exit 125; done
exec 3<&0 </dev/null
trap 'exit 0' USR1
case $term in
ignore) trap '' TERM ;;
0) trap 'exit 143' TERM ;;
*) trap "sleep $term; exit 143" TERM ;;
esac
if [ "$role" = app ]; then cat <&3 >/dev/null & fi
echo ready
exec >/dev/null 2>&1
[ "$role" = init ] && exit 0
read -r _ <&3
"""


class ContainerCreateError(KubeletError):
    """``CreateContainer`` failed; the message is the runtime's (what the kubelet reports as CreateContainerError)."""


@dataclass(eq=False)
class RuntimeContainer:
    """One container (or pod sandbox) the runtime created.

    ``exit_code`` is set when its init exited (128 + signal when a signal
    killed it); :attr:`running` turns False once every process of the
    container is gone and its cgroup removed.
    """

    id: str
    label: str
    role: str
    cgroup: str | None
    process: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None
    main_exited: asyncio.Event = field(default_factory=asyncio.Event)
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    stop_signalled: bool = False
    _pidfd: int | None = None

    @property
    def running(self) -> bool:
        """True until the container's processes are all gone."""
        return not self.gone.is_set()

    @property
    def pid(self) -> int | None:
        """The PID of its init (None without processes)."""
        return self.process.pid if self.process is not None else None


def _stop_action(stop_delay: float) -> str:
    if math.isinf(stop_delay):
        return "ignore"
    return "0" if stop_delay == 0 else f"{stop_delay:.3f}"


class ContainerRuntime:
    """Containers of every pod of one dev kubelet: processes in cgroups (or names only, without a layout).

    ``record(kind, detail)`` receives the runtime's events (a container's
    exit); ``dev_root`` is the node's ``/dev`` for the device check (see
    :mod:`~devplug.devkubelet.devicespecs`), which refuses a path that is not
    a device node when ``check_device_nodes`` is set or ``dev_root`` is not
    ``/dev``, and warns otherwise (:attr:`checks_device_nodes`).
    """

    def __init__(
        self,
        layout: CgroupLayout | None,
        record: Callable[[str, str], None],
        *,
        dev_root: Path = Path("/dev"),
        check_device_nodes: bool = False,
    ) -> None:
        self.layout = layout
        self.fs = CgroupFs(layout) if layout is not None else None
        #: The node's /dev: DeviceSpec host paths under /dev are looked up here.
        self.dev_root = Path(dev_root)
        #: Refuse a DeviceSpec host path that is not a device node, as containerd does (implied by a dev_root).
        self.check_device_nodes = check_device_nodes
        self._record = record
        self._containers: dict[str, RuntimeContainer] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        if self.fs is not None:
            atexit.register(self._at_exit)

    # -- cgroups ---------------------------------------------------------------------------------

    def ensure_cgroup(self, literal: str) -> None:
        """Make a cgroup in every hierarchy (the kubelet's QoS and pod cgroups); nothing without a layout."""
        if self.fs is not None:
            self.fs.ensure(literal)

    def cgroup_pids(self, literal: str | None) -> set[int]:
        """Every process in a cgroup and its descendants (empty without a layout)."""
        if self.fs is None or literal is None:
            return set()
        return self.fs.pids(literal)

    async def destroy_cgroup(self, literal: str | None) -> None:
        """The kubelet's ``podContainerManager.Destroy``: SIGKILL every process left in it, then remove it."""
        if self.fs is None or literal is None:
            return
        await self._kill_and_remove(literal, per_pid=True)

    async def _kill_and_remove(self, literal: str, *, per_pid: bool = False) -> None:
        assert self.fs is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _GONE_TIMEOUT
        while True:
            if per_pid:
                for pid in self.fs.pids(literal):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            else:
                self.fs.kill(literal)
            if not self.fs.pids(literal):
                try:
                    self.fs.remove(literal)
                    return
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        raise
            if loop.time() > deadline:
                raise KubeletError(f"cgroup {literal} still has processes {sorted(self.fs.pids(literal))}")
            await asyncio.sleep(0.005)

    # -- containers ------------------------------------------------------------------------------

    @property
    def checks_device_nodes(self) -> bool:
        """Whether a container's devices are checked as containerd does: asked for, or a node /dev given."""
        return self.check_device_nodes or self.dev_root != Path("/dev")

    def check_devices(self, container_id: str, devices: Iterable[tuple[str, str]]) -> None:
        """containerd's spec generation for the devices; raises :class:`ContainerCreateError` with its text
        (where the check was not asked for, warns instead: see :mod:`~devplug.devkubelet.devicespecs`)."""
        try:
            check_device_specs(devices, self.dev_root, check=self.checks_device_nodes)
        except RuntimeDeviceError as exc:
            raise ContainerCreateError(
                f'failed to generate container "{container_id}" spec: failed to generate spec: {exc}'
            ) from exc

    async def create_and_start(
        self,
        label: str,
        pod_cgroup: str | None,
        *,
        role: str,
        stop_delay: float = 0.0,
        devices: Iterable[tuple[str, str]] = (),
    ) -> RuntimeContainer:
        """``CreateContainer`` then ``StartContainer`` (or ``RunPodSandbox`` for role ``pause``).

        ``role``: ``app`` (runs until finished or killed; also sidecars),
        ``init`` (runs to completion at once), ``pause`` (the sandbox).
        Returns once the container's init is in its cgroups. Raises
        :class:`ContainerCreateError` when the devices are refused, and
        :class:`KubeletError` when the process could not start.
        """
        if self._closed:
            raise KubeletError("the container runtime is closed")
        container_id = secrets.token_hex(32)
        self.check_devices(container_id, devices)
        cgroup = None
        if self.layout is not None and pod_cgroup is not None:
            cgroup = self.layout.container_cgroup(pod_cgroup, container_id)
        container = RuntimeContainer(container_id, label, role, cgroup)
        self._containers[container_id] = container
        if self.fs is None:
            if role == "init":
                self._gone_now(container, 0)  # it ran to completion
            return container
        assert cgroup is not None
        self.fs.ensure(cgroup)
        try:
            await self._spawn(container, _stop_action(stop_delay), self.fs.procs_files(cgroup))
        except BaseException:
            self._containers.pop(container_id, None)
            with contextlib.suppress(KubeletError, OSError):
                await self._kill_and_remove(cgroup)
            raise
        return container

    async def _spawn(self, container: RuntimeContainer, term: str, procs: Iterable[Path]) -> None:
        loop = asyncio.get_running_loop()
        argv = ["/bin/sh", "-c", _SCRIPT, "devplug-container", container.role, term, *map(str, procs)]
        process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        container.process = process
        container._pidfd = os.pidfd_open(process.pid)
        loop.add_reader(container._pidfd, self._on_exit, container)
        assert process.stdout is not None
        ready, output = await _read_ready(process.stdout.fileno(), _START_TIMEOUT)
        process.stdout.close()
        if not ready:
            self._signal(container, signal.SIGKILL)
            await container.gone.wait()
            text = output.decode(errors="replace").strip() or f"exit code {container.exit_code}"
            raise KubeletError(f"container {container.label} did not start: {text}")

    def _on_exit(self, container: RuntimeContainer) -> None:
        """The pidfd says the init exited: reap it, then kill the rest and remove the cgroup."""
        loop = asyncio.get_running_loop()
        assert container._pidfd is not None and container.process is not None
        loop.remove_reader(container._pidfd)
        code = container.process.wait()
        container.exit_code = 128 - code if code < 0 else code
        container.main_exited.set()
        task = loop.create_task(self._after_exit(container))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _after_exit(self, container: RuntimeContainer) -> None:
        try:
            if self.fs is not None and container.cgroup is not None:
                await self._kill_and_remove(container.cgroup)
        except (KubeletError, OSError) as exc:
            _log.warning("dev kubelet: cleaning up after container %s: %s", container.label, exc)
        finally:
            if container._pidfd is not None:
                os.close(container._pidfd)
                container._pidfd = None
            if container.process is not None and container.process.stdin is not None:
                with contextlib.suppress(OSError):
                    container.process.stdin.close()
            self._containers.pop(container.id, None)
            container.gone.set()
            self._record("container-exited", f"{container.label} (exit code {container.exit_code})")

    def _signal(self, container: RuntimeContainer, sig: signal.Signals) -> None:
        if container._pidfd is not None and not container.main_exited.is_set():
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(container._pidfd, sig)

    def _gone_now(self, container: RuntimeContainer, code: int) -> None:
        """A container without a process stops at once."""
        if container.running:
            container.exit_code = code
            container.main_exited.set()
            container.gone.set()
            self._containers.pop(container.id, None)
            self._record("container-exited", f"{container.label} (exit code {code})")

    async def stop(self, container: RuntimeContainer, timeout: float) -> None:
        """containerd's ``StopContainer``: SIGTERM, up to ``timeout`` seconds, SIGKILL; returns when all is gone.

        A second stop with a timeout does not signal again (containerd 1.6's
        ``IsStopSignaledWithTimeout``): it only waits its own timeout.
        """
        if not container.running:
            return
        if container.process is None:
            self._gone_now(container, 143 if timeout > 0 else 137)
            return
        if timeout > 0:
            if not container.stop_signalled:
                container.stop_signalled = True
                self._signal(container, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(container.main_exited.wait(), timeout)
        self._signal(container, signal.SIGKILL)
        await container.gone.wait()

    async def kill(self, container: RuntimeContainer) -> None:
        """SIGKILL (a sandbox's stop, a crash); returns when all is gone."""
        await self.stop(container, 0)

    async def finish(self, container: RuntimeContainer) -> None:
        """The container's workload ends on its own (exit 0); returns when all is gone."""
        if not container.running:
            return
        if container.process is None:
            self._gone_now(container, 0)
            return
        self._signal(container, signal.SIGUSR1)
        await container.gone.wait()

    def pids(self, container: RuntimeContainer) -> set[int]:
        """The live processes of the container (its cgroup's; empty without a layout)."""
        if not container.running:
            return set()
        return self.cgroup_pids(container.cgroup)

    # -- the end ---------------------------------------------------------------------------------

    async def close(self) -> None:
        """Kill every container, wait until their processes are gone, remove every cgroup made (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for container in list(self._containers.values()):
            if container.process is None:
                self._gone_now(container, 137)
            else:
                self._signal(container, signal.SIGKILL)
        waits = [c.gone.wait() for c in self._containers.values()]
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), _GONE_TIMEOUT)
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await task
        if self.fs is not None:
            for problem in self.fs.remove_created():
                _log.warning("dev kubelet: a cgroup would not go: %s", problem)
            atexit.unregister(self._at_exit)

    def _at_exit(self) -> None:
        """At interpreter exit, without a loop: kill what still runs and remove the cgroups (blocking)."""
        if self._closed or self.fs is None:
            return
        self._closed = True
        for container in list(self._containers.values()):
            if container.process is not None and container.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    container.process.kill()
        self.fs.remove_created()


async def _read_ready(fd: int, timeout: float) -> tuple[bool, bytes]:
    """Read ``fd`` until the line ``ready`` (True) or end of file (False); what was read."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bool] = loop.create_future()
    buffer = bytearray()

    def readable() -> None:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            if not done.done():
                done.set_result(False)
            return
        buffer.extend(chunk)
        if b"ready\n" in buffer and not done.done():
            done.set_result(True)

    os.set_blocking(fd, False)
    loop.add_reader(fd, readable)
    try:
        ready = await asyncio.wait_for(done, timeout)
    except TimeoutError:
        ready = False
    finally:
        loop.remove_reader(fd)
    return ready, bytes(buffer).replace(b"ready\n", b"")
