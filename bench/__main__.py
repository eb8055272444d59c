"""``python -m bench [--quick] [--out PATH] [--keep]``: run, print the table, write results.json."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.report import format_table, write_results
from bench.run import run_all
from bench.settings import FULL, QUICK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few iterations of everything (for tests)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (daemon logs)")
    args = parser.parse_args(argv)
    results = run_all(QUICK if args.quick else FULL, keep=args.keep)
    write_results(results, args.out)
    print(format_table(results))
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
