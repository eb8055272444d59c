"""Access to the host: sysfs, cgroupfs, inotify and directory watching.

Everything devplug reads from or waits on in the node's kernel goes through this package, so a test can put a
kernel model behind it (:mod:`devplug.host.sysfs`'s root) and the engine is given these as seams rather than
reaching for the host itself.
"""
