"""The daemon: the assembly of the lifecycle core (:mod:`devplug.engine`) and its front ends."""
