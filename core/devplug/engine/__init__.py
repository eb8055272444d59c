"""The lifecycle core: devices, tenancies and drivers, free of wire protocols. It imports no front end
(:mod:`devplug.frontends`) and nothing of the daemon that assembles it (:mod:`devplug.daemon`).

One :class:`~devplug.engine.resource.Resource` per configured resource, driven
through a front end; its modules, by unit:

* the resource: ``resource`` (one resource's life: start its driver, retried,
  then serve through its front end; narrow methods for the daemon),
  ``frontend`` (the ``FrontEnd`` protocol a wire front end implements),
  ``resourcestatus`` (its state, last error, registrations),
  ``resourcereport`` (its status-file entry and its metrics figures),
  ``statedir`` (the state folder and each resource's part of it),
  ``quarantine`` (an operator's request to clear quarantined records);
* the driver: ``driverhost`` (the started driver: device list, relists,
  degrade and recover, the health loop), ``driver`` (an async method per hook),
  ``hookrunner`` (hooks in a thread of their own, under ``hook_timeout``),
  ``supervise`` (long-running tasks restarted when they fail);
* the devices: ``devicetable`` (what is advertised, its cached encoding,
  change notification), ``sharing`` (replicas of shared devices and their
  tenants), ``cdi`` (CDI spec files and the Allocate answers naming them);
* the lifecycle, behind ``lifecycle`` (``DeviceLifecycle``, the core's
  interface to front ends): ``admission`` (choose, allocate, record, undo),
  ``choice`` (preferred allocation within what was offered), ``requestcheck``
  (a request's checks before any hook), ``guard`` (which devices a hook may
  touch now), ``devicelocks`` (one operation at a time per device),
  ``release`` (post-stop, deallocate, retried), ``releasequeue`` (releases a
  front end found due, gated on container exit, retried with backoff),
  ``keprelease`` (the KEP's device-by-device release), ``tenantexit`` and
  ``liveness`` (whether a tenancy's containers are gone, from the pod cgroups);
* the ledger: ``ledger`` (allocation records, changed through its methods
  only), ``records`` (the immutable records), ``ledgerfile`` (the snapshot and
  the journal on disk), ``journal`` (the framed append-only journal);
* shared helpers: ``asynctools`` (events, slices, backoff, background tasks,
  daemon threads), ``serial`` (blocking calls in order in one thread),
  ``observer`` (the events a resource reports to the metrics).
"""
