#!/usr/bin/env bash
# Install and extract what the real-kernel test suite needs, into .vm/ of the repo.
#
#   tools/vm/fetch-assets.sh            # idempotent: does nothing when .vm/ is complete
#
# * qemu-system-x86 and busybox-static come from Debian (apt-get install). QEMU must emulate the Intel
#   82576 NIC (-device igb, QEMU >= 8.0) for devplug-sriov's real-NIC scenarios: on bookworm, whose own
#   QEMU is 7.2, it comes from bookworm-backports (the suite is added to apt's sources, once, when no
#   source lists it). Without root or without the suite, the older QEMU stays, with a warning, and the
#   igb scenarios are skipped (failed under DEVPLUG_REQUIRE_VM=1);
# * the distribution kernel is whatever linux-image-amd64 depends on today
#   (never pinned: old ABI versions leave the mirror); only the kernel image
#   (uncompressed to vmlinux, which QEMU boots through its PVH entry point) and
#   the modules the guest needs, with their dependencies, are extracted;
# * busybox depmod rebuilds the module index, as dpkg-deb -x does not run depmod.
#
# Result: .vm/vmlinux, .vm/modules/lib/modules/<version>/..., .vm/kernel-version, .vm/modules-wanted.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VM="$ROOT/.vm"
# nvme: an SR-IOV physical function devplug-sriov is tested on (every QEMU has it); igb and igbvf: the
# kernel's drivers of the Intel 82576 PF and its VFs, the SR-IOV NIC of QEMU >= 8.0.
MODULES="vfio vfio_iommu_type1 vfio-pci 9p 9pnet_virtio virtio_pci e1000e overlay nvme igb igbvf"

log() { echo "fetch-assets: $*" >&2; }
apt_get() { "$ROOT/tools/apt-get" "$@"; }  # waits for another apt's locks; bounded retries and timeouts

export DEBIAN_FRONTEND=noninteractive
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx depmod || {
  log "installing busybox-static"
  apt_get update -qq
  apt_get install -y -qq --no-install-recommends busybox-static >/dev/null
}

# QEMU with the emulated 82576 (igb). `-device help` lists the device models this build has.
has_igb() { command -v qemu-system-x86_64 >/dev/null && qemu-system-x86_64 -device help 2>/dev/null | grep -q '"igb"'; }
qemu_version() { qemu-system-x86_64 --version 2>/dev/null | sed -n 1p || echo "no QEMU"; }
codename="$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")"
apt_sources=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources)
debian_uri() {  # the URI apt fetches bookworm itself from (a configured mirror serves its backports too)
  local uri
  uri="$(sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\)[[:space:]]\+bookworm[[:space:]].*/\2/p' \
    "${apt_sources[@]}" 2>/dev/null | sed -n 1p)"
  [ -n "$uri" ] || uri="$(awk 'BEGIN { RS = "" } /\nSuites:[^\n]*[ \t]bookworm([ \t]|\n|$)|^Suites:[^\n]*[ \t]bookworm([ \t]|\n|$)/ {
      if (match($0, /URIs:[ \t]*[^ \t\n]+/)) { u = substr($0, RSTART, RLENGTH); sub(/URIs:[ \t]*/, "", u); print u; exit } }' \
    "${apt_sources[@]}" 2>/dev/null)"
  echo "${uri:-http://deb.debian.org/debian}"
}
add_backports() {  # idempotent: nothing when a source already lists bookworm-backports
  if grep -qsE '^[^#]*bookworm-backports' "${apt_sources[@]}"; then
    return 0
  fi
  local file=/etc/apt/sources.list.d/devplug-bookworm-backports.sources
  log "adding bookworm-backports to apt's sources ($file)"
  {
    echo "Types: deb"
    echo "URIs: $(debian_uri)"
    echo "Suites: bookworm-backports"
    echo "Components: main"
    if [ -f /usr/share/keyrings/debian-archive-keyring.gpg ]; then
      echo "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
    fi
  } >"$file"
}
if ! has_igb; then
  if [ "$(id -u)" != 0 ]; then
    log "WARNING: $(qemu_version) cannot emulate igb, and installing a newer QEMU needs root"
  else
    target=()
    if [ "$codename" = bookworm ]; then
      add_backports
      target=(-t bookworm-backports)  # QEMU 10 and the seabios it needs, from backports
    fi
    log "installing qemu-system-x86 ${target[*]}"
    if ! { apt_get update -qq && apt_get install -y -qq --no-install-recommends "${target[@]}" qemu-system-x86 >/dev/null; }; then
      log "WARNING: apt-get could not install qemu-system-x86 ${target[*]}"
    fi
  fi
  if has_igb; then
    log "$(qemu_version): has igb"
  else
    log "WARNING: $(qemu_version) has no igb device: devplug-sriov's igb scenarios will be skipped" \
      "(and fail under DEVPLUG_REQUIRE_VM=1)"
  fi
fi
command -v qemu-system-x86_64 >/dev/null || { log "no qemu-system-x86_64 after set-up"; exit 1; }

# Resolve the kernel package through the meta-package, as the mirror has it today.
resolve() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
pkg="$(resolve)"
if [ -z "$pkg" ]; then
  apt_get update -qq
  pkg="$(resolve)"
fi
if [ -z "$pkg" ]; then
  log "cannot resolve the kernel package from linux-image-amd64 (run apt-get update?)"
  exit 1
fi
version="${pkg#linux-image-}"

if [ -f "$VM/kernel-version" ] && [ "$(cat "$VM/kernel-version")" = "$version" ] \
  && [ "$(cat "$VM/modules-wanted" 2>/dev/null)" = "$MODULES" ] \
  && [ -s "$VM/vmlinux" ] && [ -f "$VM/modules/lib/modules/$version/modules.dep" ]; then
  log "assets for $version already in $VM"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log "downloading $pkg"
if ! (cd "$work" && apt_get download -qq "$pkg" 2>"$work/err"); then
  cat "$work/err" >&2
  log "apt-get download $pkg failed (run apt-get update?)"
  exit 1
fi
deb="$(ls "$work"/*.deb)"

# Every module path of the package, to resolve names and dependencies.
dpkg-deb --fsys-tarfile "$deb" | tar -t > "$work/list"
mods_prefix="lib/modules/$version/kernel"
grep -q "^\./$mods_prefix\|^$mods_prefix" "$work/list" || mods_prefix="usr/lib/modules/$version/kernel"

# The package's own modules.dep is generated by depmod at install time, so the
# dependencies are read from each module's modinfo-like "depends=" field instead.
extract() { dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$work/x" --wildcards "$@"; }
mkdir -p "$work/x"
extract "./boot/vmlinuz-$version"

find_module() {  # name with - or _ -> path in the package
  local n="$1" alt
  alt="$(echo "$n" | tr '_-' '-_')"
  grep -E "/($n|$alt)\.ko(\.xz|\.zst|\.gz)?$" "$work/list" | sed -n 1p
}
declare -A done_mods=()
queue=($MODULES)
while [ "${#queue[@]}" -gt 0 ]; do
  m="${queue[0]}"; queue=("${queue[@]:1}")
  key="$(echo "$m" | tr '-' '_')"
  [ -n "${done_mods[$key]:-}" ] && continue
  done_mods[$key]=1
  path="$(find_module "$m")"
  if [ -z "$path" ]; then
    log "module $m not found in $pkg (built in?); skipping"
    continue
  fi
  extract "$path"
  file="$work/x/${path#./}"
  case "$file" in
    *.xz) xz -d "$file"; file="${file%.xz}" ;;
    *.zst) zstd -q -d --rm "$file"; file="${file%.zst}" ;;
    *.gz) gzip -d "$file"; file="${file%.gz}" ;;
  esac
  # .modinfo holds NUL-separated key=value strings; "depends=" lists the module's dependencies.
  deps="$(tr '\0' '\n' < "$file" | sed -n 's/^depends=//p' | sed -n 1p | tr ',' ' ')"
  for d in $deps; do queue+=("$d"); done
done

rm -rf "$VM.new"
mkdir -p "$VM.new/modules/lib/modules/$version"
cp -a "$work/x/${mods_prefix%/kernel}/kernel" "$VM.new/modules/lib/modules/$version/"
/bin/busybox depmod -b "$VM.new/modules" "$version"

# vmlinuz is a bzImage whose payload is an xz stream: find it and decompress it.
python3 - "$work/x/boot/vmlinuz-$version" "$VM.new/vmlinux" <<'PY'
import lzma, sys
data = open(sys.argv[1], "rb").read()
magic = b"\xfd7zXZ\x00"
start = data.find(magic)
while start != -1:
    try:
        out = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[start:])
    except lzma.LZMAError:
        start = data.find(magic, start + 1)
        continue
    if out[:4] == b"\x7fELF":
        open(sys.argv[2], "wb").write(out)
        sys.exit(0)
    start = data.find(magic, start + 1)
sys.exit("no xz-compressed ELF kernel found in " + sys.argv[1])
PY
echo "$version" > "$VM.new/kernel-version"
echo "$MODULES" > "$VM.new/modules-wanted"  # a changed list extracts again
rm -rf "$VM"
mv "$VM.new" "$VM"
log "kernel $version ready in $VM ($(du -sh "$VM" | cut -f1))"
