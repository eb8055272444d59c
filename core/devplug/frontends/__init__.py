"""Front ends: the wire protocols through which the kubelet drives the lifecycle core (:mod:`devplug.engine`).

Each front end is a package of its own; the core imports none of them, and
they do not import each other. What they share is a module here: ``callgate``
(a resource's calls held while a newer instance takes the node over, then run
here or forwarded to it).
"""
