#!/usr/bin/env bash
# `make image`: devplug's OCI image without a Docker engine, from Debian's packages and the wheels of `make dist`.
#
#   bash tools/image/build.sh DIST OUT
#
# 1. tools/image/setup.sh installs Debian's debootstrap, umoci and podman where they are missing;
# 2. debootstrap: a minimal Debian bookworm root filesystem with python3 (3.11, the Python the wheelhouse of
#    `make dist` was downloaded for) and python3-venv;
# 3. a virtual environment at /opt/devplug in it: the core with every extra for users (prometheus-client for
#    [metrics]) and every driver, from DIST's wheels and the wheelhouse (--no-index: what `make dist` built and
#    downloaded, nothing else; tools/image/contents.py lists them); pip then removed from it;
# 4. apt's caches and lists, docs and bytecode caches removed;
# 5. umoci packs it as the one layer of an OCI image, OUT/oci, tagged devplug:VERSION (the name `podman load`
#    gives it, and the DaemonSet's image), with the Dockerfile's entrypoint and command, and
#    OUT/devplug-VERSION.oci.tar, the same layout as an archive;
# 6. tools/image/smoke.py loads that archive with podman and checks the image: its version and drivers, `devplug
#    check-config` on every config deploy/ renders, and the daemon of the mock overlay (with the CDI component)
#    against a dev kubelet, through the DaemonSet's own mounts.
#
# Needs root (debootstrap and chroot). PYTHON (default: python3) runs the helpers and the smoke test's dev kubelet:
# an environment with devplug installed (the Makefile passes .venv/bin/python). DEVPLUG_DEBIAN_MIRROR overrides
# the Debian mirror (default http://deb.debian.org/debian).
set -euo pipefail
dist=${1:?usage: build.sh DIST OUT}
out=${2:?usage: build.sh DIST OUT}
here=$(cd "$(dirname "$0")" && pwd)

if [ "$(id -u)" != 0 ]; then
  echo "make image: needs root (debootstrap and chroot build the root filesystem)" >&2
  exit 1
fi
python=${PYTHON:-python3}
started=$SECONDS
bash "$here/setup.sh"

core_wheel=$(ls "$dist"/devplug-*-py3-none-any.whl 2>/dev/null | head -1 || true)
if [ -z "$core_wheel" ] || [ ! -d "$dist/wheelhouse" ]; then
  echo "make image: no wheels in $dist (run make dist)" >&2
  exit 1
fi
version=$(basename "$core_wheel" | sed -E 's/^devplug-([^-]+)-.*/\1/')
listed=$("$python" "$here/contents.py" requirements "$dist" --prefix /tmp/wheels/dist)
mapfile -t requirements <<<"$listed"

mirror=${DEVPLUG_DEBIAN_MIRROR:-http://deb.debian.org/debian}

rm -rf "$out"
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/devplug-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
oci="$out/oci"
name=devplug
tag="$oci:$name:$version"

umoci init --layout "$oci"
umoci new --image "$tag"
umoci unpack --image "$tag" "$work/bundle" >/dev/null
rootfs="$work/bundle/rootfs"

echo "make image: debootstrap bookworm from $mirror" >&2
debootstrap --variant=minbase --include=python3,python3-venv bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -20 "$work/debootstrap.log" >&2; exit 1; }

echo "make image: installing ${requirements[*]#/tmp/wheels/dist/}" >&2
mkdir -p "$rootfs/tmp/wheels/dist" "$rootfs/tmp/wheels/deps"
cp "$dist"/*.whl "$rootfs/tmp/wheels/dist/"
cp "$dist"/wheelhouse/*.whl "$rootfs/tmp/wheels/deps/"
chroot "$rootfs" /usr/bin/python3 -m venv /opt/devplug
chroot "$rootfs" /opt/devplug/bin/python -m pip --isolated --disable-pip-version-check install --quiet \
  --no-index --no-cache-dir --find-links /tmp/wheels/dist --find-links /tmp/wheels/deps "${requirements[@]}"
chroot "$rootfs" /opt/devplug/bin/python -m pip --isolated uninstall --quiet --yes pip

rm -rf "$rootfs/tmp/wheels" "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
  "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/var/log/*.log \
  "$rootfs"/root/.cache
find "$rootfs/opt/devplug" -name __pycache__ -type d -prune -exec rm -rf {} +

umoci repack --image "$tag" "$work/bundle" >/dev/null
umoci config --image "$tag" --os linux --architecture amd64 \
  --config.entrypoint /opt/devplug/bin/devplug \
  --config.cmd run --config.cmd --config --config.cmd /etc/devplug/config.toml \
  --config.env PATH=/opt/devplug/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.env PYTHONDONTWRITEBYTECODE=1 --config.env PYTHONUNBUFFERED=1 \
  --config.label org.opencontainers.image.title=devplug \
  --config.label "org.opencontainers.image.version=$version" \
  --config.label org.opencontainers.image.licenses=Apache-2.0
umoci gc --layout "$oci"
archive="$out/devplug-$version.oci.tar"
tar -C "$oci" -cf "$archive" .
built=$((SECONDS - started))
echo "make image: built in ${built} s: $oci ($name:$version), $archive ($(du -h "$archive" | cut -f1))," \
  "unpacked $(du -sh "$rootfs" | cut -f1)" >&2

"$python" "$here/smoke.py" "$archive" "$name:$version"
echo "make image: $archive ($name:$version) built in ${built} s, smoke-tested in $((SECONDS - started - built)) s"
