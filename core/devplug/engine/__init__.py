"""The daemon: one :class:`~devplug.engine.resource.Resource` per configured resource.

Modules: ``hookrunner`` (driver hooks off the event loop, under timeouts),
``devicetable`` (the advertised devices and their cached encoding),
``ledger`` (allocations, on disk), ``servicer`` (the DevicePlugin gRPC
service), ``registration`` (Register with backoff), ``resource`` (one
resource's life: serve, register, re-register, health), ``reconciler``
(release detection through PodResources), ``status`` (the status file),
``daemon`` (all resources, the lock, signals).
"""
