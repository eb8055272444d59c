"""The test kit for devplug and for third-party drivers.

* :mod:`devplug.testing.plugin` -- the pytest plugin (entry point ``pytest11``):
  fixtures for a dev kubelet and a running daemon in a temporary folder.
* :mod:`devplug.testing.pcisysfs` -- a model of the kernel's PCI sysfs for drivers
  that bind and unbind devices.
* :mod:`devplug.testing.dflsysfs` -- a model of the kernel's FPGA DFL sysfs, device
  nodes and ioctls, shared through files with a daemon under test.
* :mod:`devplug.testing.kubelet` -- the dev kubelet for drivers' own suites and demos.
"""
