#!/usr/bin/env bash
# Builds the base image without a container registry: a Debian rootfs made by
# mmdebstrap from Debian's package mirror as a tarball, then `docker import`ed.
# Usage: bootstrap.sh IMAGE_TAG [LABEL=VALUE ...]
set -euo pipefail
tag=${1:?usage: bootstrap.sh IMAGE_TAG [LABEL=VALUE ...]}
shift
suite=${SIM_DEBIAN_SUITE:-bookworm}
mirror=${SIM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# What every node needs: Python for torch, iproute2/iptables for network faults,
# procps for finding processes to signal.
packages=python3,python3-venv,iproute2,iptables,procps,ca-certificates

command -v mmdebstrap >/dev/null || {
  echo "bootstrap.sh: mmdebstrap is missing; install it with: apt-get install -y mmdebstrap" >&2
  exit 1
}
# mmdebstrap, not debootstrap: it downloads with apt and unpacks in one pass (about 40 s
# here instead of 52-65 s). Its merged-usr hook merges /usr as debootstrap does; without
# it bookworm pulls in usrmerge and perl. Docs, man pages and locales are never unpacked
# (a smaller image); apt's lists and caches are cleaned by mmdebstrap itself. Unshare mode,
# even as root: its chroot's /proc and /dev mounts live in a namespace of their own, so a
# killed build leaves no mount behind (debootstrap's /proc stayed mounted under /tmp).
hooks=/usr/share/mmdebstrap/hooks/merged-usr
options=(--mode=unshare --variant=minbase --include="$packages" --format=tar
         --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
         --dpkgopt='path-exclude=/usr/share/locale/*')
[ -d "$hooks" ] && options+=(--hook-dir="$hooks")

rootfs=$(mktemp /tmp/elastic-sim-rootfs.XXXXXX.tar)
trap 'rm -f "$rootfs"' EXIT

echo "[base] mmdebstrap $suite ($packages) from $mirror"
# A file, not a pipe into docker import: a mmdebstrap that fails half-way must not leave an
# image of half a rootfs under the tag every later run trusts.
mmdebstrap "${options[@]}" "$suite" "$rootfs" "$mirror" 2>&1 | sed -u 's/^/[base]   /'

changes=(--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
         --change 'CMD ["/bin/bash"]')
for label in "$@"; do changes+=(--change "LABEL $label"); done
echo "[base] docker import -> $tag"
docker import "${changes[@]}" "$rootfs" "$tag" >/dev/null
echo "[base] done: $tag"
