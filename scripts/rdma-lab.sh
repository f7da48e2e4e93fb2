#!/usr/bin/env bash
# scripts/rdma-lab.sh COMMAND [ARGS...]
#
# Boots a throwaway QEMU guest (software CPU: /dev/kvm here cannot boot a stock kernel) running
# Debian's stock kernel with soft-RoCE (`rdma_rxe`), and runs COMMAND in it, in the current
# directory, exiting with COMMAND's status. Inside the guest:
#   - the host's root is the guest's root, read-only over 9p (host-built binaries run as they
#     are; build before booting: the guest sees files as they were at boot), and the current
#     directory is shared again at its own path (so it is visible even under /tmp);
#   - /tmp, /run, /dev/shm and HOME=/tmp/home are writable tmpfs; `ulimit -l unlimited`;
#   - a veth pair v0 = 10.77.0.1/24, v1 = 10.77.0.2/24, and `rxe0` on v0 (RoCE v2, GID index 1:
#     both addresses reach rxe0 through its loopback; two rxe devices could not reach each other);
#   - PEERCACHE_LAB=1, PEERCACHE_LAB_DEVICE=rxe0, PEERCACHE_LAB_GID=1,
#     PEERCACHE_LAB_ADDRS="10.77.0.1 10.77.0.2", PEERCACHE_LAB_MTU (rxe0's active MTU in
#     bytes), and PEERCACHE_CLUSTER_SECRET (generated when the
#     caller did not set one) in the environment.
# COMMAND's output is the guest console's. The kernel is the one `linux-image-amd64` depends on
# today; it and the initramfs are cached under ${PEERCACHE_CI_CACHE:-~/.cache/peercache-ci}.
# Environment: LAB_TIMEOUT (seconds, default 480) bounds the whole run; LAB_MEM (MiB, 2048).
# Facts behind the layout: ../shared/reference/soft-roce.md in the project's workspace.
set -euo pipefail
if [ $# -eq 0 ]; then
  echo "usage: scripts/rdma-lab.sh COMMAND [ARGS...]" >&2
  exit 2
fi
CACHE=${PEERCACHE_CI_CACHE:-$HOME/.cache/peercache-ci}/rdma-lab
LAB_TIMEOUT=${LAB_TIMEOUT:-480}
LAB_MEM=${LAB_MEM:-2048}
mkdir -p "$CACHE"

# --- host packages: qemu, the rxe verbs provider, the verbs tools and perftest ------------------
need=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
[ -e /etc/libibverbs.d/rxe.driver ] || need+=(ibverbs-providers)
command -v ibv_devices >/dev/null 2>&1 || need+=(ibverbs-utils)
command -v ib_read_bw >/dev/null 2>&1 || need+=(perftest)
command -v rdma >/dev/null 2>&1 || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  echo "rdma-lab: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# --- the guest kernel and initramfs, built once per kernel package --------------------------------
kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
if [ -z "$kpkg" ]; then
  apt-get update -qq
  kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
fi
[ -n "$kpkg" ] || { echo "rdma-lab: cannot resolve linux-image-amd64's kernel" >&2; exit 1; }
kdir="$CACHE/$kpkg-init2"  # the suffix names the init script's version
if [ ! -s "$kdir/initrd.gz" ] || [ ! -s "$kdir/vmlinuz" ]; then
  echo "rdma-lab: preparing $kpkg"
  work=$(mktemp -d)
  (cd "$work" && apt-get download -q "$kpkg" busybox-static >/dev/null 2>&1)
  mkdir -p "$work/k" "$work/bb" "$work/initrd/bin" "$work/initrd/lib/modules" "$kdir"
  dpkg-deb -x "$work"/linux-image-*.deb "$work/k"
  dpkg-deb -x "$work"/busybox-static_*.deb "$work/bb"
  cp "$work/bb/bin/busybox" "$work/initrd/bin/busybox"
  cp "$work"/k/boot/vmlinuz-* "$kdir/vmlinuz.tmp"
  # The modules the lab needs, with their dependencies (from each module's `depends=` modinfo:
  # the package ships no modules.dep), in load order.
  python3 - "$work/k/lib/modules" "$work/initrd/lib/modules" <<'PY'
import os, re, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
paths = {}
for root, _, files in os.walk(src):
    for f in files:
        if f.endswith(".ko"):
            paths[f[:-3].replace("-", "_")] = os.path.join(root, f)
def deps(name):
    data = open(paths[name], "rb").read()
    m = re.search(rb"(?:^|\0)depends=([^\0]*)", data)
    return [d.replace("-", "_") for d in m.group(1).decode().split(",") if d] if m else []
want = ["virtio_pci", "9pnet_virtio", "9p", "veth", "crc32_generic", "rdma_rxe", "ib_uverbs",
        "rdma_ucm"]
order, seen = [], set()
def visit(n):
    if n in seen:
        return
    seen.add(n)
    if n not in paths:
        return  # built into the kernel
    for d in deps(n):
        visit(d)
    order.append(n)
for n in want:
    visit(n)
with open(os.path.join(dst, "order"), "w") as out:
    for i, n in enumerate(order):
        shutil.copy(paths[n], os.path.join(dst, f"{i:02d}-{n}.ko"))
        out.write(f"{i:02d}-{n}.ko\n")
print(f"rdma-lab: {len(order)} modules")
PY
  cat > "$work/initrd/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc 2>/dev/null || { mkdir -p /proc && mount -t proc proc /proc; }
mkdir -p /sys /dev /newroot && mount -t sysfs sys /sys && mount -t devtmpfs dev /dev
for m in $(cat /lib/modules/order); do insmod /lib/modules/$m || echo "lab: insmod $m failed"; done
mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=262144,cache=loose hostroot /newroot
for d in tmp var/tmp run dev/shm; do mount -t tmpfs tmpfs /newroot/$d; done
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm && mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs tmpfs /newroot/dev/shm
mkdir -p /newroot/tmp/lab-io
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none labio /newroot/tmp/lab-io
# The caller's directory at its own path, also when it lies under a tmpfs mounted above.
p=$(cat /newroot/tmp/lab-io/projdir)
mkdir -p "/newroot$p" 2>/dev/null
mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=262144,cache=loose proj "/newroot$p"
chroot /newroot /bin/bash /tmp/lab-io/boot.sh </dev/console >/dev/console 2>&1
echo "lab: guest done"
poweroff -f
INIT
  chmod +x "$work/initrd/init"
  (cd "$work/initrd" && find . | "$work/initrd/bin/busybox" cpio -o -H newc 2>/dev/null | gzip -1) > "$kdir/initrd.tmp"
  mv "$kdir/vmlinuz.tmp" "$kdir/vmlinuz"
  mv "$kdir/initrd.tmp" "$kdir/initrd.gz"
  rm -rf "$work"
fi

# --- the command, its environment and the guest's network ------------------------------------------
io=$(mktemp -d)
trap 'rm -rf "$io"' EXIT
secret=${PEERCACHE_CLUSTER_SECRET:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}
{
  echo "#!/bin/bash"
  echo "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  echo "export HOME=/tmp/home PEERCACHE_LAB=1 PEERCACHE_LAB_DEVICE=rxe0 PEERCACHE_LAB_GID=1"
  echo "export PEERCACHE_LAB_ADDRS='10.77.0.1 10.77.0.2'"
  printf 'export PEERCACHE_CLUSTER_SECRET=%q\n' "$secret"
  for v in RUST_LOG RUST_BACKTRACE PEERCACHE_LAB_ARGS; do
    [ -n "${!v:-}" ] && printf 'export %s=%q\n' "$v" "${!v}"
  done
  echo "mkdir -p \$HOME; ulimit -l unlimited"
  echo "ip link set lo up"
  echo "ip link add v0 type veth peer name v1"
  echo "ip addr add 10.77.0.1/24 dev v0; ip addr add 10.77.0.2/24 dev v1"
  echo "ip link set v0 up; ip link set v1 up"
  echo "rdma link add rxe0 type rxe netdev v0"
  # rxe0 turns ACTIVE a few seconds after the link is up.
  echo "for i in \$(seq 1 300); do ibv_devinfo -d rxe0 2>/dev/null | grep -q PORT_ACTIVE && break; sleep 0.1; done"
  echo "ibv_devinfo -d rxe0 | grep -E 'hca_id|state|active_mtu' || { echo 'lab: rxe0 did not come up'; echo 97 > /tmp/lab-io/rc; exit; }"
  # The port's active MTU in bytes ("active_mtu: 1024 (3)"), for the tests that check it.
  echo "export PEERCACHE_LAB_MTU=\$(ibv_devinfo -d rxe0 | awk '/active_mtu/ { print \$2; exit }')"
  printf 'cd %q\n' "$PWD"
  printf '%q ' "$@"
  echo
  echo "echo \$? > /tmp/lab-io/rc"
} > "$io/boot.sh"
echo 98 > "$io/rc" # stays if the guest never reaches the command
printf '%s' "$PWD" > "$io/projdir"

echo "rdma-lab: booting $kpkg (TCG) for: $*"
set +e
timeout --kill-after=10 "$LAB_TIMEOUT" qemu-system-x86_64 \
  -accel tcg -cpu max -smp 2 -m "$LAB_MEM" -nographic -nic none -no-reboot \
  -kernel "$kdir/vmlinuz" -initrd "$kdir/initrd.gz" \
  -append "console=ttyS0 quiet loglevel=3 panic=-1" \
  -fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap \
  -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
  -fsdev local,id=labio,path="$io",security_model=none,multidevs=remap \
  -device virtio-9p-pci,fsdev=labio,mount_tag=labio \
  -fsdev local,id=proj,path="$PWD",security_model=none,readonly=on,multidevs=remap \
  -device virtio-9p-pci,fsdev=proj,mount_tag=proj
qrc=$?
set -e
rc=$(cat "$io/rc" 2>/dev/null || echo 98)
if [ "$qrc" -eq 124 ] || [ "$qrc" -eq 137 ]; then
  echo "rdma-lab: the guest ran past ${LAB_TIMEOUT}s and was stopped" >&2
  exit 124
fi
case "$rc" in
  97) echo "rdma-lab: soft-RoCE did not come up in the guest" >&2 ;;
  98) echo "rdma-lab: the guest did not run the command (qemu exit $qrc)" >&2 ;;
esac
exit "$rc"
