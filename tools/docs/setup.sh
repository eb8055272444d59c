#!/usr/bin/env bash
# What the documentation site's build needs from Debian's packages, installed when missing (idempotent):
#   graphviz  `dot`, which renders the diagrams of docs/diagrams/ to SVG during the build (sphinx.ext.graphviz)
# Called by `make setup` (which `make test` runs before the tests) and `make docs`, and by .ci/run; a no-op when dot
# is installed. Through tools/apt-get: apt waits up to 600 s for another apt's locks (unattended-upgrades on a fresh
# VM) instead of failing, and every mirror connection that stalls is dropped after 30 s and retried.
set -euo pipefail
if command -v dot >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "docs set-up: Graphviz's dot is missing and installing it needs root: apt-get install graphviz" >&2
  exit 1
fi
echo "docs set-up: installing graphviz (Debian's package) for the documentation's diagrams" >&2
apt_get() { "$(dirname "$0")/../apt-get" "$@"; }
export DEBIAN_FRONTEND=noninteractive
apt_get update -qq
apt_get install -y -qq --no-install-recommends graphviz >/dev/null
dot -V >&2
