#!/usr/bin/env bash
# CI only: a Docker engine and stand-in base images on a machine that cannot pull from a registry.
#
#   docker/ci-base.sh            # install, start dockerd, make the base images; prints DOCKER_HOST
#   docker/ci-base.sh --stop     # stop the dockerd this script started (by PID) and remove docker0
#
# Steps (each skipped when already done, so reruns take a second or two):
#   1. Debian packages docker.io, docker-compose, debootstrap (apt-get, as root).
#   2. dockerd started by hand (no systemd) with everything under $STT_DOCKERD_DIR (default
#      /tmp/sttd: short, so the socket path stays under the 108-byte limit).
#   3. debian:bookworm-slim imported from a debootstrap minbase rootfs; the tarball is cached in
#      $STT_CI_CACHE (default ~/.cache/stt-docker-ci).
#   4. python:3.11-slim-bookworm built FROM it: Debian's python3 with a venv at /usr/local, so
#      `python` and `pip` behave as in the official image. The host's CA bundle and an
#      /etc/pip.conf with `cert =` are baked in, because HTTPS here goes through a TLS-intercepting
#      proxy. That belongs to this stand-in only, never to the project's Dockerfile.
set -euo pipefail

D=${STT_DOCKERD_DIR:-/tmp/sttd}
CACHE=${STT_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stt-docker-ci}
CA_BUNDLE=${STT_CI_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
SUITE=bookworm
BASE_IMAGE=debian:bookworm-slim
PY_IMAGE=python:3.11-slim-bookworm
STANDIN_LABEL=org.stt.ci-standin
# Debian's CLI: BuildKit works with it without the buildx plugin, and it matches dockerd 20.10.
DOCKER=${DOCKER:-/usr/bin/docker}
export DOCKER_HOST=unix://$D/docker.sock
export DOCKER_BUILDKIT=1

log() { printf '[ci-base %5ss] %s\n' "$SECONDS" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

dockerd_pid() {
  # PID of a live dockerd started with our pidfile, or nothing.
  local pid
  [[ -s $D/pid ]] || return 1
  pid=$(<"$D/pid")
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == dockerd ]] || return 1
  echo "$pid"
}

stop_dockerd() {
  local pid
  if pid=$(dockerd_pid); then
    log "stopping dockerd (pid $pid)"
    kill -TERM "$pid"
    for _ in $(seq 1 60); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "dockerd did not stop in 30 s; sending KILL to pid $pid"
      kill -KILL "$pid" || true
    fi
  fi
  # dockerd leaves its bridge behind.
  if ip link show docker0 >/dev/null 2>&1; then
    ip link delete docker0 || log "could not delete docker0"
  fi
  if [[ -s $D/ip_forward.orig ]]; then
    cat "$D/ip_forward.orig" >/proc/sys/net/ipv4/ip_forward 2>/dev/null || true
    rm -f "$D/ip_forward.orig"
  fi
}

if [[ ${1:-} == --stop ]]; then
  stop_dockerd
  exit 0
fi

[[ $(id -u) == 0 ]] || die "run as root (dockerd, debootstrap and apt-get need it)"

# ---------------------------------------------------------------- 1. packages
need=()
command -v dockerd >/dev/null || need+=(docker.io)
[[ -x /usr/bin/docker ]] || need+=(docker.io)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
if ((${#need[@]})); then
  log "apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${need[@]}" iptables >/dev/null
fi

# ---------------------------------------------------------------- 2. dockerd
mkdir -p "$D" "$CACHE"
if pid=$(dockerd_pid); then
  log "dockerd already running (pid $pid)"
else
  cat /proc/sys/net/ipv4/ip_forward >"$D/ip_forward.orig" 2>/dev/null || true
  log "starting dockerd in $D"
  # setsid: the daemon outlives this script and its caller's process group; stop it with --stop.
  setsid dockerd --data-root "$D/data" --exec-root "$D/exec" --pidfile "$D/pid" \
    -H "$DOCKER_HOST" </dev/null >"$D/dockerd.log" 2>&1 &
  for _ in $(seq 1 120); do
    $DOCKER version >/dev/null 2>&1 && break
    sleep 0.25
  done
  $DOCKER version >/dev/null 2>&1 || { tail -20 "$D/dockerd.log" >&2; die "dockerd did not come up"; }
  log "dockerd up (pid $(<"$D/pid"))"
fi

image_exists() { $DOCKER image inspect "$1" >/dev/null 2>&1; }

# ---------------------------------------------------------------- 3. debian:bookworm-slim
apt_mirror() {
  # The host's Debian mirror: deb822 sources (URIs:) or one-line sources (deb URL SUITE ...).
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    uri=$(awk '/^URIs:/ {u=$2} /^Suites:/ && / '"$SUITE"'( |$)/ {print u; exit}' "$f")
    [[ -n $uri ]] && { echo "$uri"; return; }
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $f ]] || continue
    uri=$(awk '$1 == "deb" && $3 == "'"$SUITE"'" {print $2; exit}' "$f")
    [[ -n $uri ]] && { echo "$uri"; return; }
  done
  echo http://deb.debian.org/debian
}

if image_exists "$BASE_IMAGE"; then
  log "$BASE_IMAGE exists"
else
  tarball=$CACHE/$SUITE-minbase.tar
  if [[ ! -s $tarball ]]; then
    mirror=$(apt_mirror)
    rootfs=$D/rootfs
    rm -rf "$rootfs"
    mkdir -m 755 "$rootfs"
    log "debootstrap --variant=minbase $SUITE from $mirror"
    debootstrap --variant=minbase "$SUITE" "$rootfs" "$mirror" >"$D/debootstrap.log" 2>&1 \
      || { tail -20 "$D/debootstrap.log" >&2; die "debootstrap failed"; }
    chmod 755 "$rootfs"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$rootfs"
  fi
  log "docker import $tarball as $BASE_IMAGE"
  $DOCKER import --change 'CMD ["bash"]' --change "LABEL $STANDIN_LABEL=1" \
    "$tarball" "$BASE_IMAGE" >/dev/null
fi

# ---------------------------------------------------------------- 4. python:3.11-slim-bookworm
ca_sum=$(sha256sum "$CA_BUNDLE" | cut -c1-16)
have_sum=$($DOCKER image inspect -f "{{ index .Config.Labels \"$STANDIN_LABEL.ca\" }}" \
  "$PY_IMAGE" 2>/dev/null || true)
if [[ $have_sum == "$ca_sum" ]]; then
  log "$PY_IMAGE exists"
else
  ctx=$D/python-ctx
  rm -rf "$ctx"
  mkdir -p "$ctx"
  cp "$CA_BUNDLE" "$ctx/ca-certificates.crt"
  # Only the certificate: inside a build, pip uses PyPI like any user's build does.
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$ctx/pip.conf"
  cat >"$ctx/Dockerfile" <<EOF
FROM $BASE_IMAGE
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      python3 python3-venv ca-certificates netbase tzdata \\
 && rm -rf /var/lib/apt/lists/* \\
 && python3 -m venv /usr/local \\
 && ln -sf python3 /usr/local/bin/python
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY pip.conf /etc/pip.conf
ENV LANG=C.UTF-8
LABEL $STANDIN_LABEL=1 $STANDIN_LABEL.ca=$ca_sum
CMD ["python3"]
EOF
  log "building stand-in $PY_IMAGE"
  $DOCKER build -q -t "$PY_IMAGE" "$ctx" >/dev/null
  rm -rf "$ctx"
  $DOCKER run --rm "$PY_IMAGE" sh -c 'python --version && pip --version' >&2
fi

log "ready: export DOCKER_HOST=$DOCKER_HOST"
echo "DOCKER_HOST=$DOCKER_HOST"
