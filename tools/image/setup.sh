#!/usr/bin/env bash
# What `make image` needs from Debian's packages, installed when missing (idempotent):
#   debootstrap  the image's root filesystem (a minimal Debian bookworm)
#   umoci        packs that root filesystem as an OCI image without a container engine
#   podman       runs the built image in the smoke test (tools/image/smoke.py), as a node's runtime would
#   runc         its OCI runtime there: crun, podman's default, refuses these machines' hybrid cgroup hierarchy
#                ("cgroups in hybrid mode not supported"); runc runs on it
# Through tools/apt-get: apt waits up to 600 s for another apt's locks (unattended-upgrades on a fresh VM) instead
# of failing, and every mirror connection that stalls is dropped after 30 s and retried.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
  echo "image set-up: needs root (apt-get install)" >&2
  exit 1
fi
missing=()
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v umoci >/dev/null 2>&1 || missing+=(umoci)
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "image set-up: installing ${missing[*]} (Debian's packages)" >&2
apt_get() { "$(dirname "$0")/../apt-get" "$@"; }
export DEBIAN_FRONTEND=noninteractive
apt_get update -qq
apt_get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
