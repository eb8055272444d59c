#!/usr/bin/env bash
# The image's smoke test (run by `make image`): unpack the OCI image built by tools/image/build.sh into a fresh
# bundle and run, inside its root filesystem (chroot), the command its config names with `--version`: it must
# print `devplug VERSION (hook contract ...)`. Then `devplug drivers` must list every driver, none broken.
#
#   bash tools/image/smoke.sh OCI_LAYOUT VERSION
set -euo pipefail
oci=${1:?usage: smoke.sh OCI_LAYOUT VERSION}
version=${2:?usage: smoke.sh OCI_LAYOUT VERSION}
work=$(mktemp -d "${TMPDIR:-/tmp}/devplug-smoke.XXXXXX")
trap 'rm -rf "$work"' EXIT

umoci unpack --image "$oci:$version" "$work/bundle" >/dev/null
entrypoint=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["process"]["args"][0])' \
  "$work/bundle/config.json")
got=$(chroot "$work/bundle/rootfs" "$entrypoint" --version)
echo "smoke: $entrypoint --version: $got"
case "$got" in
  "devplug $version (hook contract "*) ;;
  *) echo "smoke: FAILED: expected devplug $version (hook contract ...)" >&2; exit 1 ;;
esac
drivers=$(chroot "$work/bundle/rootfs" "$entrypoint" drivers)
echo "$drivers"
for driver in mock vfio sriov fpga shared; do
  grep -q "^$driver .*devplug-$driver $version" <<<"$drivers" \
    || { echo "smoke: FAILED: driver $driver missing from the image" >&2; exit 1; }
done
if grep -q BROKEN <<<"$drivers"; then echo "smoke: FAILED: a driver is broken" >&2; exit 1; fi
echo "smoke: ok"
