"""A stand-in for the Kubernetes API server, for testing drivers with the real client library.

What a node-local driver talks to -- ``resource.k8s.io`` ResourceSlices, ResourceClaims and DeviceClasses (v1,
v1beta2, v1beta1, as a chosen control-plane release serves them), core/v1 Nodes, Pods and Namespaces,
``coordination.k8s.io/v1`` Leases, and discovery -- served over real HTTP on ``127.0.0.1`` (a free port) with
the API server's REST paths, JSON bodies and ``Status`` errors, so lightkube (or any client) runs unchanged against it::

    from devplug.testing.apiserver import ApiServer

    with ApiServer() as api:                       # Kubernetes 1.36: resource.k8s.io/v1, no authentication
        client = lightkube.Client(config_for(api.url), field_manager="fpga.example.com")
        client.apply(my_slice)                     # server-side apply
        api.get("resourceslices", "node-a-fpga")   # inspect what was stored
        api.faults.fail(500, verb="list")          # make the next list fail
        api.compact(); api.close_watches()         # resumed watches now get 410 Gone

    with ApiServer(release="1.32") as old:         # resource.k8s.io/v1beta1 only, no device taints
        old.restart(release="1.34")                # an upgrade: v1 from now on, watches cut

:class:`devplug.testing.scheduler.SchedulerStandIn` allocates claims on it as kube-scheduler does;
:mod:`devplug.testing.leaseapi`, :mod:`devplug.testing.podapi` and :mod:`devplug.testing.nodelease` are views and
actors on the same server.

Modelled, each behaviour citing the source it follows (the modules say where):

* **control-plane releases 1.32 to 1.36** (:mod:`.versions`, :mod:`.codec`, :mod:`.discovery`):
  ``ApiServer(release=..., resource_versions=...)`` serves the ``resource.k8s.io`` versions a control plane of that
  release serves (1.32 v1beta1; 1.33 v1beta1 and v1beta2; 1.34 on v1, the betas when asked for), one stored form
  (v1's) converted to and from each as the real conversions do (v1beta1's ``basic`` devices and flat requests),
  holding only the fields that release's types have; a version not served is the text ``404 page not found``;
  fields a version has not are a ``500`` for server-side apply and warned, dropped or refused (``fieldValidation``)
  for other writes; discovery (``/apis``, ``/apis/<group>[/<version>]``, ``/api``, ``/api/v1``, ``/version``);
  :meth:`ApiServer.restart` as an upgrade or a restart with other flags;
* **resourceVersion** (the API concepts page, "Resource versions"): one revision counter for every object
  (etcd's); a write that changes an object takes the next one, an update that changes nothing is not written;
  ``metadata.generation`` +1 on a spec change of slices and classes.
* **get/list** ("Semantics for get and list"): unset -- most recent; ``0`` -- any (``limit`` ignored, as the
  watch cache does); ``N`` -- not older than ``N`` (``504`` "Too large resource version" after 3 s when the
  server has not reached it), or exactly ``N`` with ``resourceVersionMatch=Exact`` or a ``limit`` (410 "The
  resourceVersion for the provided list is too old." before the window); ``limit``/``continue`` chunks of one
  snapshot, ``remainingItemCount`` when unfiltered, an expired ``continue`` is 410 with an inconsistent token;
  ``ValidateListOptions``'s 422s; label selectors (``labels.Parse``, set-based too) and the field selectors each
  kind supports (``400 field label not supported``): ResourceSlice ``metadata.name``, ``spec.nodeName``,
  ``spec.driver`` (Kubernetes 1.36; ``spec.pool.name`` is 1.37's).
* **watch** ("Efficient detection of changes", "Watch bookmarks", "410 Gone responses"): chunked JSON lines
  ``{"type": "ADDED|MODIFIED|DELETED|BOOKMARK|ERROR", "object": ...}``; no resourceVersion or ``0``: synthetic
  ADDED of the current objects first; ``N``: the changes after ``N`` from the kept window, or an ERROR event
  carrying a 410 ``Expired`` Status when ``N`` is older (then the stream ends); objects entering or leaving the
  selectors as ADDED/DELETED; BOOKMARKs with ``allowWatchBookmarks`` (every ``bookmark_interval`` and on
  :meth:`ApiServer.bookmark`); ``sendInitialEvents``; ``timeoutSeconds`` (default: ``min_request_timeout`` to
  twice that, as the server picks).
* **writes** (``registry/generic/registry/store.go``): create (``generateName``, ``409 AlreadyExists``), update
  with optimistic concurrency (``409 Conflict`` on a stale ``metadata.resourceVersion``), JSON merge and JSON
  patches, server-side apply (:mod:`.fields`: field managers in ``managedFields``, conflicts naming owner and
  field, ``force``, removal of fields an applier dropped), ``dryRun=All``, delete with preconditions, graceful
  deletion of pods, finalizers and ``deletionTimestamp``, ``propagationPolicy`` Background (default), Orphan and
  Foreground, deletecollection, the pods' ``binding`` subresource, the ``status`` subresources of claims, nodes
  and pods (each side keeps the other's fields).
* **the garbage collector** (kube-controller-manager's, in a thread of its own): dependents whose owners are
  all gone are deleted in the background after their owner (a node's slices after the node), references to a
  gone owner are removed, orphaning and foreground deletion are finished.
* **validation** (:mod:`.validation`): names (DNS subdomain), every object's label keys and values
  (``IsLabelKey``, ``IsLabelValue``: a value holds no ``,``), ResourceSlice driver and pool names, exactly one
  node selection, device names (DNS label, unique), at most 128 devices (64 with taints, counters or list
  attributes), 32 attributes and capacities, attribute values, the immutable driver, pool name and node name;
  ResourceClaim requests and their counts, opaque configs, the immutable spec, ``reservedFor`` only with an
  allocation, the allocation immutable once set; DeviceClass selectors, configs, ``extendedResourceName``;
  Leases; pods' containers; node taints; namespace names. Errors are 422 ``Invalid`` Statuses with a cause per
  field, in ``field.Error``'s words.
* **issue 41's DRA features** (Kubernetes 1.36's rules; each module cites its source): the feature gates
  DRAAdminAccess, DRAResourceClaimDeviceStatus, DRAPartitionableDevices, DRAConsumableCapacity (and
  DRADeviceTaints) off by default per release as ``kube_features.go`` says, ``ApiServer(enabled_features=...,
  disabled_features=...)`` to change them, the fields they cover dropped on write when off (:mod:`.gates`);
  capacity request policies, counter sets, ``consumesCounters`` and per-device node selection
  (:mod:`.slicerules`); ``status.devices`` (allocated devices only, conditions, data, networkData) and share IDs
  (:mod:`.statusrules`), merged by server-side apply as a list map keyed by driver, device, pool and shareID;
  admin access only in namespaces labelled ``resource.kubernetes.io/admin-access: "true"`` (:mod:`.admin`), with
  core/v1 Namespaces served for it; the scheduler stand-in allocates shares, counters and admin access
  (:mod:`devplug.testing.scheduler`).
* **test hooks**: :attr:`ApiServer.faults` (the next requests of a verb/resource fail with 500, 429 with
  ``Retry-After``, ...), :meth:`ApiServer.close_watches` (clean or cut mid-stream), :meth:`ApiServer.compact`,
  :attr:`ApiServer.requests` and :meth:`ApiServer.count`, in-process reads and writes taking the same path as
  HTTP ones.
* **HTTPS and bearer tokens** (:mod:`.server`), when asked for: ``ApiServer(tls=context, tokens={...})``; a
  request without a known token is the authentication filter's ``401 Unauthorized``.

Not modelled (the real server differs; test against a cluster before relying on these): authentication other
than a fixed set of bearer tokens (client certificates, TokenReview, anonymous requests), authorization and
admission (objects may name namespaces that do not exist: only the admin-access check reads them; no quotas, no
``NodeRestriction``: a driver may write any node's slices here; no per-driver authorization of
``status.devices`` writes, ``AuthorizedForDeviceStatus``); aggregated discovery and OpenAPI; protobuf and CBOR;
other kinds and API versions (``resource.k8s.io/v1alpha3``, ResourceClaimTemplates, DeviceTaintRules); the
fields of a version outside the structs :mod:`.versions` describes (they pass unchecked); ``managedFields`` in
each entry's own version (the field sets are in the stored v1 form whatever apiVersion an entry names);
defaulting of requests; CEL evaluation and the validation not listed above (a claim's ``capacity.requests`` are
not validated); strategic merge patches with lists or directives (refused with 415); keyed lists other than
those :mod:`.fields` names (others are atomic), and the exact position structured-merge-diff gives an item an
apply adds to a keyed list others also own (here: after the existing items); the resourceclaim controller (see
:meth:`devplug.testing.scheduler.SchedulerStandIn.deallocate`); the watch cache's per-watcher buffers; HTTP/2 and
watch over WebSocket.
"""

from __future__ import annotations

from devplug.testing.apiserver.errors import ApiStatusError, FieldError
from devplug.testing.apiserver.resources import RESOURCES, Resource
from devplug.testing.apiserver.server import ApiServer, Faults
from devplug.testing.apiserver.storage import Event, RequestRecord, Storage, Writer

__all__ = [
    "RESOURCES",
    "ApiServer",
    "ApiStatusError",
    "Event",
    "Faults",
    "FieldError",
    "RequestRecord",
    "Resource",
    "Storage",
    "Writer",
]
