"""The daemon: the assembly of the lifecycle core (:mod:`devplug.engine`) and its front ends
(:mod:`devplug.frontends`) into one process, and what that process offers besides.

Modules, by job:

* the process: ``process`` (``Daemon``: assembling the resources and their
  front ends, run, signals, the bounded shutdown, hooks abandoned;
  ``run_daemon``), ``lock`` (the state folder's lock) and ``lockholder``
  (proving which live process holds it), ``podliveness`` (container liveness
  from the pod cgroups: the core's ``PodProbe``), ``cdispecs`` (each
  resource's CDI spec file: the core's ``CdiSpecFile``);
* front ends: ``assembly`` (one shape for each kubelet API's front ends,
  assembled only when some resource uses the API), ``dpassembly`` (the
  device-plugin API's: the checkpoint, the plugin folder, the release
  reconciler) and ``draassembly`` (DRA's, imported only when the config has a
  DRA resource);
* handover between two instances on one node (a rolling update):
  ``handover`` (the old instance's side, ``Predecessor``, and the new one's,
  ``take_over``, arbitrated by the state lock), ``takeover`` (taking the
  state lock through its gate, and the new instance's side until the old one's
  last word) and ``handoverfiles`` (the messages they leave each other in the
  state dir, the instance's identity);
* reload and drain: ``reload`` (what a new config changes, and applying it:
  added resources start, changed ones restart, removed ones drain and are torn
  down);
* status: ``status`` (the status file built from each resource's report,
  written after changes, read by ``devplug status``), ``statusschema``
  (its shape, checked when read) and ``readiness`` (the rules ``/readyz``
  and ``devplug status`` share: why the daemon is not ready, the exit codes);
* the optional servers: ``metricsendpoint`` (the metrics and probes served
  from the resources' figures), ``metrics`` (the Prometheus metrics and their
  endpoints), ``drametrics`` (those of resources served through DRA) and
  ``httpserve`` (the bounded HTTP server under them), imported only when
  ``[metrics] enabled``; ``cdicleanup`` (CDI spec files no resource
  serves any more).
"""
