"""Front ends: the wire protocols through which the kubelet drives the lifecycle core (:mod:`devplug.engine`).

Each front end is a package of its own; the core imports none of them, and
they do not import each other.
"""
