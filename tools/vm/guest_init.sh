#!/bin/busybox sh
# The guest's /init (busybox, in the initramfs built by tools/vm/run_guest.py).
#
# Loads the modules the tests need, mounts the host's / (9p, read-only) under a
# tmpfs overlay so it is writable, mounts the writable results share, and runs
# /devplug-vm-results/cmd.sh chrooted into the host's file system: the host's
# Python and the project's virtual environment appear at their usual paths.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

say() { echo "devplug-vm: $*"; }

for m in virtio_pci 9pnet_virtio 9p overlay e1000e nvme igb igbvf vfio-pci vfio_iommu_type1; do
  modprobe "$m" || say "modprobe $m failed"
done

mkdir -p /host /rw /newroot
opts="trans=virtio,version=9p2000.L,msize=262144"
mount -t 9p -o "$opts,ro,cache=loose" hostroot /host || say "cannot mount the host root"
mount -t tmpfs -o size=256m tmpfs /rw
mkdir -p /rw/upper /rw/work
overlay=1
if ! mount -t overlay overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work /newroot; then
  say "overlay failed; using the read-only host root"
  mount --bind /host /newroot
  overlay=0
fi
mkdir -p /newroot/devplug-vm-results /newroot/lib/modules
mount -t 9p -o "$opts" results /newroot/devplug-vm-results || say "cannot mount the results share"
mount --bind /proc /newroot/proc
mount --bind /sys /newroot/sys
mount --bind /dev /newroot/dev
mount --bind /lib/modules /newroot/lib/modules
# The overlay already makes every path writable. A tmpfs on /tmp would hide a
# checkout that lives there (CI clones into temporary folders), so only the
# read-only fallback gets one.
if [ "$overlay" = 0 ]; then
  mount -t tmpfs -o size=128m tmpfs /newroot/tmp
fi

# Loopback up: tests talk to the daemon they start over 127.0.0.1 (its metrics), and to nothing else.
ip link set lo up || say "cannot bring lo up"

say "running tests"
chroot /newroot /bin/sh /devplug-vm-results/cmd.sh
say "tests done"
sync
poweroff -f
echo o > /proc/sysrq-trigger
