"""The test kit for devplug and for third-party drivers.

* :mod:`devplug.testing.plugin` -- the pytest plugin (entry point ``pytest11``):
  fixtures for a dev kubelet and a running daemon in a temporary folder.
* :mod:`devplug.testing.pcisysfs` -- a model of the kernel's PCI sysfs for drivers
  that bind and unbind devices.
* :mod:`devplug.testing.leaseapi` -- a model of the Kubernetes API server's
  ``coordination.k8s.io/v1`` Lease endpoints over HTTP on loopback, for drivers
  that coordinate through Leases.
* :mod:`devplug.testing.nodes` -- several simulated nodes on one machine, each a
  dev kubelet and a real daemon, for drivers whose devices span nodes.
"""
