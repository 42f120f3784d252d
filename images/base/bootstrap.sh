#!/usr/bin/env bash
# Builds the base image without a container registry: a Debian rootfs made by
# debootstrap from Debian's package mirror, then `docker import`ed.
# Usage: bootstrap.sh IMAGE_TAG [LABEL=VALUE ...]
set -euo pipefail
tag=${1:?usage: bootstrap.sh IMAGE_TAG [LABEL=VALUE ...]}
shift
suite=${SIM_DEBIAN_SUITE:-bookworm}
mirror=${SIM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# What every node needs: Python for torch, iproute2/iptables for network faults,
# procps for finding processes to signal.
packages=python3,python3-venv,iproute2,iptables,procps,ca-certificates

command -v debootstrap >/dev/null || {
  echo "bootstrap.sh: debootstrap is missing; install it with: apt-get install -y debootstrap" >&2
  exit 1
}
rootfs=$(mktemp -d /tmp/elastic-sim-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT

echo "[base] debootstrap $suite ($packages) from $mirror"
debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" \
  | sed -u 's/^/[base]   /'
# Smaller image, and nothing inside tries to reach a mirror later.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
       "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*

changes=(--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
         --change 'CMD ["/bin/bash"]')
for label in "$@"; do changes+=(--change "LABEL $label"); done
echo "[base] docker import -> $tag"
tar -C "$rootfs" -c . | docker import "${changes[@]}" - "$tag" >/dev/null
echo "[base] done: $tag"
