"""The ``devplug`` command (and ``python -m devplug``): ``devplug run`` starts the daemon without loading click
(:mod:`devplug.cli.run`); every other command, and ``run --help``, is the click CLI of :mod:`devplug.cli.commands`."""

from __future__ import annotations

import os
import sys


def main() -> None:
    args = sys.argv[1:]
    # gRPC's C core logs routine connection events (GOAWAY on a kubelet restart) at INFO to stderr.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    if args[:1] == ["run"] and not {"-h", "--help"} & set(args[1:]):
        from devplug.cli.run import main as run

        run(args[1:])
        return
    from devplug.cli.commands import main as cli

    cli()


if __name__ == "__main__":
    main()
