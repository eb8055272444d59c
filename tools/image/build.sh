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
# 4. a CycloneDX SBOM of that environment (tools/image/metadata.py: cyclonedx-py, reading the image's own packages)
#    at /opt/devplug/sbom.cdx.json in the image and OUT/devplug-VERSION.cdx.json beside it;
# 5. apt's caches and lists, docs and bytecode caches removed;
# 6. umoci packs it as the one layer of an OCI image, OUT/oci, tagged devplug:VERSION (the name `podman load`
#    gives it, and the DaemonSet's image), with the Dockerfile's entrypoint and command and the OCI labels
#    org.opencontainers.image.* (title, description, version, licenses, revision: the commit, created: its time,
#    source: DEVPLUG_IMAGE_SOURCE or the origin remote; tools/image/metadata.py), and
#    OUT/devplug-VERSION.oci.tar, the same layout as an archive;
# 7. tools/image/smoke.py loads that archive with podman and checks the image: its version and drivers, `devplug
#    check-config` on every config deploy/ renders, and the daemon of the mock overlay (with the CDI component)
#    against a dev kubelet, through the DaemonSet's own mounts.
#
# Needs root (debootstrap and chroot). PYTHON (default: python3) runs the helpers and the smoke test's dev kubelet:
# an environment with devplug and the dev extra installed (the Makefile passes .venv/bin/python). DEVPLUG_DEBIAN_MIRROR
# overrides the Debian mirror (default http://deb.debian.org/debian).
#
# The image is for this machine's architecture (dpkg's: amd64 or arm64), the one the wheelhouse of `make dist` was
# downloaded for and the smoke test can run: an arm64 machine builds the arm64 image. DEVPLUG_IMAGE_ARCH asks for
# another, which is refused, saying why: a foreign image needs a wheelhouse for its architecture and QEMU's user
# emulation registered with the kernel (binfmt_misc) to run debootstrap's second stage, pip and the smoke test in
# it. Build the other architecture on a machine of it, or from the Dockerfile with Docker Buildx
# (docs/operator/deploy.md, "The image": `docker buildx build --platform linux/arm64`).
set -euo pipefail
dist=${1:?usage: build.sh DIST OUT}
out=${2:?usage: build.sh DIST OUT}
here=$(cd "$(dirname "$0")" && pwd)

if [ "$(id -u)" != 0 ]; then
  echo "make image: needs root (debootstrap and chroot build the root filesystem)" >&2
  exit 1
fi
python=${PYTHON:-python3}
arch=$(dpkg --print-architecture)
wanted=${DEVPLUG_IMAGE_ARCH:-$arch}
if [ "$wanted" != "$arch" ]; then
  emulated="not registered"
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] && emulated="registered"
  echo "make image: builds for this machine's architecture ($arch), not $wanted: an image for another needs a" \
    "wheelhouse of $wanted wheels (make dist downloads this machine's) and QEMU's user emulation to run its" \
    "debootstrap, pip and smoke test (qemu-aarch64 in binfmt_misc: $emulated). Build it on a $wanted machine with" \
    "make image, or from the Dockerfile: docker buildx build --platform linux/$wanted -t devplug:VERSION ." >&2
  exit 1
fi
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
# The test kit came as the core's dependency (until devplug 1.0): the image never carries it (contents.py's
# REMOVED_AFTER_INSTALL).
chroot "$rootfs" /opt/devplug/bin/python -m pip --isolated uninstall --quiet --yes devplug-testing
chroot "$rootfs" /opt/devplug/bin/python -m pip --isolated uninstall --quiet --yes pip

echo "make image: the SBOM of /opt/devplug (cyclonedx-py)" >&2
sbom="$out/devplug-$version.cdx.json"
"$python" "$here/metadata.py" sbom "$sbom" --root "$rootfs" -- chroot "$rootfs" /opt/devplug/bin/python
cp "$sbom" "$rootfs/opt/devplug/sbom.cdx.json"
mapfile -t found_labels < <("$python" "$here/metadata.py" labels "$version")
label_args=()
for label in "${found_labels[@]}"; do label_args+=(--config.label "$label" --manifest.annotation "$label"); done

rm -rf "$rootfs/tmp/wheels" "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
  "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/var/log/*.log \
  "$rootfs"/root/.cache
find "$rootfs/opt/devplug" -name __pycache__ -type d -prune -exec rm -rf {} +

umoci repack --image "$tag" "$work/bundle" >/dev/null
umoci config --image "$tag" --os linux --architecture "$arch" \
  --config.entrypoint /opt/devplug/bin/devplug \
  --config.cmd run --config.cmd --config --config.cmd /etc/devplug/config.toml \
  --config.env PATH=/opt/devplug/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.env PYTHONDONTWRITEBYTECODE=1 --config.env PYTHONUNBUFFERED=1 \
  "${label_args[@]}"
umoci gc --layout "$oci"
archive="$out/devplug-$version.oci.tar"
tar -C "$oci" -cf "$archive" .
built=$((SECONDS - started))
echo "make image: built in ${built} s: $oci ($name:$version), $archive ($(du -h "$archive" | cut -f1))," \
  "unpacked $(du -sh "$rootfs" | cut -f1)" >&2

"$python" "$here/smoke.py" "$archive" "$name:$version" --sbom "$sbom"
echo "make image: $archive ($name:$version) built in ${built} s, smoke-tested in $((SECONDS - started - built)) s"
