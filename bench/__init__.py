"""devplug's benchmark: speed, footprint and scale of the real daemon, each next to a floor measured in the same run.

``python -m bench`` (``make bench``) runs the daemon (``devplug run``, mock
driver) as a child process against a kubelet-side client over unix sockets in
a short temporary folder under /tmp, and, as floors, a bare grpcio server on
the same generated code answering precomputed responses and a raw unix-socket
round trip. It prints a table with each goal beside its figure and writes
``bench/results.json``. ``--quick`` runs a few iterations of everything (the
test suite uses it so the benchmark cannot rot).

Keep this module light: floor servers start as ``python -m bench.floors``.
"""

import os

# gRPC's C core reads this once, at its first import: keep routine GOAWAY notices out of the table.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
