"""The DRA front end: the kubelet's Dynamic Resource Allocation API (``resource.k8s.io``) over the core.

``apiversions`` (which ``resource.k8s.io`` version the API server serves, v1,
v1beta2 or v1beta1, found by discovery, whether it keeps device taints,
consumable capacity and counters, and each version's shape), ``nodeselector`` (whether a claim's allocation is for this
node: its node selector against the node's name and labels),
``devicenames`` (devplug device IDs as ResourceSlice device names, both ways),
``slicecontent`` (the device table as a pool of ResourceSlices: attributes,
replicas, taints for unavailable devices, the split into slices), ``capacity``
(a shared device as one device with consumable capacity, KEP-5075), ``counters``
(parts' parents as counter sets, KEP-4815), ``dropped`` (gated fields an apply's
answer lacks: the fall back to the older forms),
``slices`` (publishing the pool by server-side apply, kept in step with the
device table, retried, deleted on request), ``sliceswatch`` (the watch of
the node's slices that tells it someone else changed them, with bookmarks, and
started again when it fails or falls silent), ``claims`` (reading a
ResourceClaim's allocation and configuration for this driver and pool, and
which prepared claims still exist), ``quantity`` (Kubernetes quantities read
exactly).

The kubelet plugin: ``registration`` (the plugin-watcher registration socket,
made again when the kubelet loses it), ``kubeletrule`` (whether the node's
kubelet keys DRA plugins by driver name, 1.32, or by endpoint, 1.33 on),
``reregistration`` (registering again when a kubelet keying by name dropped
this instance), ``service`` (NodePrepareResources and
NodeUnprepareResources through the core's lifecycle), ``refusals`` (the kinds of
prepare and unprepare failures the metrics count), ``shares`` (a claim's shares of
a device with consumable capacity as its replicas, KEP-5075), ``adminaccess``
(admin-access claims prepared without the core, only in namespaces labelled for
it, KEP-5018), ``devicestatus`` (a claim's ``status.devices`` entries from the
driver's ``allocate`` answer, KEP-4817), ``statuswriter`` (writing and removing
them by server-side apply as the driver), ``claimcdi`` (a prepared
claim's CDI spec), ``health`` (the KEP-4680 health stream, with the driver's
reasons), ``reconcile`` (releases no unprepare asks for: claims deleted while the
daemon was down, device-plugin leftovers, unfinished releases), ``plugin``
(all of it made whole once the driver started) and ``frontend`` (the
resource's :class:`~devplug.engine.frontend.FrontEnd`, holding its plugin).
"""
