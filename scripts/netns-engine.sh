#!/usr/bin/env bash
# A second (third, ...) Docker engine on this machine that Swarm sees as a host of its own: a dockerd
# in a network namespace of its own, with its own data root, exec root, socket, hostname and address.
# The engines' namespaces are wired to one bridge in a "switch" namespace, so hosts reach each other
# (Swarm's 2377, 7946 and 4789) and nothing is bound on this machine's own interfaces.
#
#   scripts/netns-engine.sh start NAME HOSTNAME ADDRESS/PREFIX   # e.g. start esa sim-host-a 10.213.0.1/24
#   scripts/netns-engine.sh load NAME IMAGE...                   # docker save here | docker load there
#   scripts/netns-engine.sh stop NAME                            # the engine, its containers, its files
#   scripts/netns-engine.sh socket NAME                          # its DOCKER_HOST (unix:///run/elastic-sim-engines/NAME/docker.sock)
#
# Needs root, Debian's docker.io (dockerd, containerd), iproute2 and util-linux (nsenter, unshare);
# no privileged container and no registry. docs/SWARM.md, "Two engines on one machine".
set -euo pipefail

SWITCH=elastic-sim-switch    # the namespace holding the bridge every engine's link plugs into
RUN=/run/elastic-sim-engines
DATA=/var/lib/elastic-sim-engines

die() { echo "netns-engine: $*" >&2; exit 1; }
socket() { echo "unix://$RUN/$1/docker.sock"; }

check_name() {
  [[ "$1" =~ ^[a-z][a-z0-9]{0,9}$ ]] || die "engine name '$1': use 1-10 lowercase letters and digits (it names network links)"
}

ensure_switch() {
  if [ ! -e "/run/netns/$SWITCH" ]; then
    ip netns add "$SWITCH"
    ip -n "$SWITCH" link add br0 type bridge
    ip -n "$SWITCH" link set br0 up
    ip -n "$SWITCH" link set lo up
  fi
}

start() {
  local name=$1 host=$2 address=$3
  check_name "$name"
  [[ "$host" =~ ^[A-Za-z0-9][A-Za-z0-9.-]*$ ]] || die "hostname '$host': not a hostname"
  [[ "$address" =~ ^[0-9.]+/[0-9]+$ ]] || die "address '$address': give ADDRESS/PREFIX, e.g. 10.213.0.2/24"
  [ -e "/run/netns/$name" ] && die "engine '$name' exists; stop it first: $0 stop $name"
  ensure_switch
  ip netns add "$name"
  # One veth pair: NAME-sw in the switch's bridge, NAME-eth in the engine's namespace.
  ip link add "$name-sw" netns "$SWITCH" type veth peer name "$name-eth" netns "$name"
  ip -n "$SWITCH" link set "$name-sw" master br0 up
  ip -n "$name" addr add "$address" dev "$name-eth"
  ip -n "$name" link set "$name-eth" up
  ip -n "$name" link set lo up
  mkdir -p "$RUN/$name" "$DATA/$name"
  # nsenter --net, not `ip netns exec`: that one remounts /sys, which hides the cgroup mounts dockerd needs.
  # unshare --uts: a hostname of its own (Swarm names nodes by hostname, which must be unique).
  nsenter --net="/run/netns/$name" unshare --uts sh -c \
    "hostname '$host' && exec dockerd --data-root '$DATA/$name' --exec-root '$RUN/$name' \
       -H '$(socket "$name")' --pidfile '$RUN/$name/docker.pid' --cgroup-parent 'elastic-sim-$name'" \
    >"$RUN/$name/dockerd.log" 2>&1 &
  for _ in $(seq 1 60); do
    DOCKER_HOST=$(socket "$name") docker info >/dev/null 2>&1 && { echo "$(socket "$name")"; return 0; }
    sleep 1
  done
  die "engine '$name' did not answer within 60 s; see $RUN/$name/dockerd.log"
}

load() {
  local name=$1; shift
  docker save "$@" | DOCKER_HOST=$(socket "$name") docker load >/dev/null
}

stop() {
  local name=$1
  check_name "$name"
  local pidfile="$RUN/$name/docker.pid"
  if [ -S "$RUN/$name/docker.sock" ]; then
    # Leave any swarm and remove every container first, so no shim or mount outlives the engine.
    DOCKER_HOST=$(socket "$name") docker swarm leave --force >/dev/null 2>&1 || true
    ids=$(DOCKER_HOST=$(socket "$name") docker ps -aq 2>/dev/null || true)
    [ -z "$ids" ] || DOCKER_HOST=$(socket "$name") docker rm -f $ids >/dev/null 2>&1 || true
  fi
  if [ -f "$pidfile" ]; then
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  # Mounts the engine left (overlay layers, netns files) would keep its data root busy.
  grep -o " $DATA/$name[^ ]*\| $RUN/$name[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  [ -e "/run/netns/$name" ] && ip netns delete "$name"
  rm -rf "${DATA:?}/$name" "${RUN:?}/$name"
  # The switch goes with the last engine.
  if [ -e "/run/netns/$SWITCH" ] && [ -z "$(ip -n "$SWITCH" -o link show master br0 2>/dev/null)" ]; then
    ip netns delete "$SWITCH"
  fi
}

[ "$(id -u)" = 0 ] || die "run as root (it makes network namespaces and starts dockerd)"
case "${1:-}" in
  start) [ $# = 4 ] || die "usage: $0 start NAME HOSTNAME ADDRESS/PREFIX"; start "$2" "$3" "$4" ;;
  load) [ $# -ge 3 ] || die "usage: $0 load NAME IMAGE..."; check_name "$2"; load "${@:2}" ;;
  stop) [ $# = 2 ] || die "usage: $0 stop NAME"; stop "$2" ;;
  socket) [ $# = 2 ] || die "usage: $0 socket NAME"; check_name "$2"; socket "$2" ;;
  *) die "usage: $0 start|load|stop|socket NAME ..." ;;
esac
