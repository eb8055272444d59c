"""The device-plugin front end: the kubelet's ``v1beta1.DevicePlugin`` API over the core.

``frontend`` (one resource's front end: the options it registers, adoption of a
lost ledger from the kubelet's checkpoint), ``pluginserver`` (serve the socket,
register, re-register after a kubelet restart), ``registration_client``
(``Registration/Register``), ``servicer`` (the gRPC service: ListAndWatch
encoding, Allocate, PreStartContainer, the KEP's PostStopContainer and
Deallocate), ``tenancy`` (reuse or new tenancy, from the kubelet's
checkpoint, and how a forgotten tenancy is ending), ``checkpointview`` (the
kubelet's checkpoint as evidence), ``sightings`` (the kubelet runs that
listed each allocation, and the checkpoint's rewrites as they happen),
``podresources_client`` and ``reconciler`` (release detection through
PodResources and the checkpoint, for kubelets that never call Deallocate),
``pluginfolder`` (the device-plugin folder, watched for the signs of a kubelet
restart every resource's front end is told of). Calls held while a newer
instance takes over, then forwarded to it: :mod:`devplug.frontends.callgate`.
"""
