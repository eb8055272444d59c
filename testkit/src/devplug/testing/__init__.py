"""The test kit for devplug and for third-party drivers (the README's "Testing a driver" shows each part).

* :mod:`devplug.testing.plugin` -- the pytest plugin (entry point ``pytest11``):
  fixtures for a dev kubelet and a running daemon in a temporary folder;
  importing it imports neither gRPC nor the dev kubelet.
* :mod:`devplug.testing.conformance` -- :class:`DriverConformance`, the driver
  contract as tests for a driver's suite to subclass.
* :mod:`devplug.testing.recorder` -- :class:`HookRecorder`, a driver's record of
  its hook calls, and :func:`read_hook_calls` to read it back, typed.
* :mod:`devplug.testing.sink` -- :class:`RecordingSink`, a device sink that
  records a driver's pushes, for unit tests.
* :mod:`devplug.testing.entrypoints` -- which drivers the daemon under test can
  load, and test doubles it can load without their being installed.
* :mod:`devplug.testing.pcisysfs` -- a model of the kernel's PCI sysfs for drivers
  that bind and unbind devices.
* :mod:`devplug.testing.apiserver` -- a stand-in for the Kubernetes API server over
  HTTP on loopback (``resource.k8s.io/v1`` ResourceSlices, ResourceClaims and
  DeviceClasses, Nodes, Pods, Leases; resourceVersion, watch, 410 Gone, server-side
  apply, the garbage collector, injected faults), for DRA drivers and any driver
  that talks to the API server; :mod:`devplug.testing.scheduler` allocates claims
  on it as kube-scheduler does (KEP-5004's claims for extended resources too).
* :mod:`devplug.testing.leaseapi`, :mod:`devplug.testing.podapi` -- the same server
  as drivers that coordinate through Leases use it (``LeaseApiServer``, with the
  Leases and the pods as in-process views), and :mod:`devplug.testing.nodelease`
  models the kubelet's node Lease heartbeat, for drivers that tell a live node
  from a dead one.
* :mod:`devplug.testing.nodes` -- several simulated nodes on one machine, each a
  dev kubelet and a real daemon, for drivers whose devices span nodes.
* :mod:`devplug.testing.classsysfs` -- a model of ``/sys/class/<class>/`` device
  trees (attributes, device nodes, hot removal, failing reads), for drivers that
  discover devices in a sysfs class; the ``sysfs_class_tree`` fixture gives one.
  :mod:`devplug.testing.sysfsfiles` is the read side these file-backed models share.
* :mod:`devplug.testing.dflsysfs` -- a model of the kernel's FPGA DFL sysfs, device
  nodes and ioctls, shared through files with a daemon under test.
* :mod:`devplug.testing.devnodes` -- character devices for models and test drivers
  (container runtimes refuse a device that is not a device node).
* :mod:`devplug.testing.kubelet` -- the dev kubelet for drivers' own suites and demos.
* :mod:`devplug.testing.configs`, :mod:`devplug.testing.daemon` -- configs laid
  out for the dev kubelet, and the daemon as a process or in a thread.

Nothing is imported here, so importing the package stays cheap; import the
module you need.
"""
