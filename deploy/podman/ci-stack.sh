#!/usr/bin/env bash
# CI's proof that `docker compose --profile cpu up` starts: the compose stack run with Podman,
# checked from outside. From the repository root:
#   deploy/podman/ci-stack.sh          # build the images, run the stack, check it, tear it down
#   deploy/podman/ci-stack.sh build    # only build the images (scripts/test.sh runs this in the
#                                      # background while it sets up the Python environment)
#   deploy/podman/ci-stack.sh run      # only run and check, on images built before
# The images come from deploy/podman/build-images.sh (no registry); docker-compose.yml runs
# with deploy/podman/compose.override.yml (image names only) through Debian's docker-compose
# talking to Podman's Docker API on a private socket. The checks:
#   vdet pulls the camera over RTSP and publishes detections, Prometheus scrapes it (up, and a
#   vdet series): check_stack.py, from the host through the published ports;
#   the image's own HEALTHCHECK passes (`podman healthcheck run`);
#   vdet's process runs as uid 10001, not root;
#   `podman stop` ends vdet within 10 s with exit status 0;
#   started again, vdet has the zone the first check added over the API (the `state` volume);
#   then the fleet (docker-compose.fleet.yml with deploy/podman/compose.fleet.override.yml):
#   three NATS servers and two vdet nodes; both ready and seeing each other, the demo camera
#   placed on one and read through either, Prometheus scraping both (check_fleet.py); the node
#   running the camera killed (SIGKILL), the other runs it and its detections go on.
# Where Podman is missing or unusable it says SKIP and exits 0, unless CI_STACK_REQUIRED=1
# (scripts/test.sh sets it when it installed the system packages, as in CI). On failure every
# container's log and state is printed and kept in $CI_STACK_LOG_DIR (default build/stack-logs).
# CI_STACK_TIMEOUT (default 120) bounds the seconds check_stack.py waits. Without systemd,
# Podman logs "unable to get systemd connection" for health-check timers: harmless here, the
# check is run on demand instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
start_all=$SECONDS

skip() {
  if [[ "${CI_STACK_REQUIRED:-0}" == 1 ]]; then
    echo "ci-stack: FAIL: $1 (CI_STACK_REQUIRED=1)" >&2
    exit 1
  fi
  echo "ci-stack: SKIP: $1; the Podman stack was not run"
  exit 0
}

# Rootless Podman and mmdebstrap's unshare mode may work too, but only root was tried.
[[ $(id -u) == 0 ]] || skip "it runs as root only"
for tool in podman runc mmdebstrap docker-compose python3; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (Debian packages: .ci/system-packages.txt)"
done
# shellcheck source=deploy/podman/podman-env.sh
. deploy/podman/podman-env.sh
if ! podman_problem=$(podman info 2>&1 >/dev/null); then
  skip "podman cannot run here: ${podman_problem:0:300}"
fi

what=${1:-all}
case $what in
  all | build | run) ;;
  *)
    echo "usage: $0 [build|run]" >&2
    exit 2
    ;;
esac
LOG_DIR=${CI_STACK_LOG_DIR:-build/stack-logs}
mkdir -p "$LOG_DIR"
if [[ $what != run ]]; then
  rm -rf "$LOG_DIR/build"
  VDET_PODMAN_LOG_DIR=$LOG_DIR/build deploy/podman/build-images.sh
  echo "ci-stack: images built in $((SECONDS - start_all)) s"
  if [[ $what == build ]]; then exit 0; fi
fi

for image in vdet:cpu localhost/vdet-camera:bookworm localhost/vdet-prometheus:bookworm \
  localhost/vdet-nats:2.15.1; do
  if ! podman image exists "$image"; then
    echo "ci-stack: FAIL: no image $image; deploy/podman/build-images.sh builds it" >&2
    exit 1
  fi
done

# docker-compose (1.29, Debian's) speaks Docker's API; Podman serves it on a socket of ours.
SOCKET=$LOG_DIR/podman.sock
podman system service --time=0 "unix://$PWD/$SOCKET" >"$LOG_DIR/podman-service.log" 2>&1 &
service_pid=$!
export DOCKER_HOST=unix://$PWD/$SOCKET
COMPOSE=(docker-compose -p vdetstack -f docker-compose.yml -f deploy/podman/compose.override.yml
  --profile cpu)
SERVICES=(vdet-cpu camera prometheus)
FLEET=(docker-compose -p vdetfleet -f docker-compose.fleet.yml
  -f deploy/podman/compose.fleet.override.yml)
FLEET_SERVICES=(nats-1 nats-2 nats-3 camera vdet-1 vdet-2 prometheus)

collect_logs() { # collect_logs PROJECT SERVICE...: each running service's log and state
  local id name project=$1
  shift
  local -n compose=$project
  for service in "$@"; do
    id=$("${compose[@]}" ps -q "$service" 2>/dev/null || true)
    [[ -n $id ]] || continue
    name=$LOG_DIR/$project-$service
    podman logs "$id" >"$name.log" 2>&1 || true
    podman inspect "$id" >"$name.inspect.json" 2>&1 || true
    echo "----- $service: $(podman inspect --format '{{.State.Status}} exit={{.State.ExitCode}}' "$id" 2>&1); last lines of its log:"
    tail -n 40 "$name.log"
  done
}

finish() {
  local status=$?
  if ((status != 0)); then
    echo "ci-stack: FAILED; logs kept in $LOG_DIR" >&2
    collect_logs COMPOSE "${SERVICES[@]}" >&2
    collect_logs FLEET "${FLEET_SERVICES[@]}" >&2
  fi
  "${COMPOSE[@]}" down -v --remove-orphans >"$LOG_DIR/compose-down.log" 2>&1 || true
  "${FLEET[@]}" down -v --remove-orphans >"$LOG_DIR/fleet-down.log" 2>&1 || true
  kill "$service_pid" 2>/dev/null || true
  wait "$service_pid" 2>/dev/null || true
  rm -f "$SOCKET"
  exit "$status"
}
trap finish EXIT

for _ in $(seq 50); do
  [[ -S $SOCKET ]] && break
  sleep 0.1
done
start_up=$SECONDS
"${COMPOSE[@]}" up -d --no-build vdet-cpu prometheus
python3 deploy/podman/check_stack.py --timeout "${CI_STACK_TIMEOUT:-120}"

vdet=$("${COMPOSE[@]}" ps -q vdet-cpu)
podman healthcheck run "$vdet"
echo "ci-stack: ok   the image's health check passes"

user=$(podman inspect --format '{{.Config.User}}' "$vdet")
uids=$(podman exec "$vdet" sh -c 'grep ^Uid: /proc/1/status')
read -r _ ruid euid _ <<<"$uids"
if [[ $user != 10001:10001 || $ruid != 10001 || $euid != 10001 ]]; then
  echo "ci-stack: FAIL vdet runs as '$user' (process: $uids), not uid 10001" >&2
  exit 1
fi
echo "ci-stack: ok   vdet runs as uid 10001 (USER $user)"

stop_start=$(date +%s%N)
podman stop --time 10 "$vdet" >/dev/null
stop_ms=$((($(date +%s%N) - stop_start) / 1000000))
exit_code=$(podman inspect --format '{{.State.ExitCode}}' "$vdet")
if [[ $exit_code != 0 ]] || ((stop_ms >= 10000)); then
  echo "ci-stack: FAIL podman stop took $stop_ms ms, exit status $exit_code" >&2
  exit 1
fi
echo "ci-stack: ok   podman stop ended vdet in $stop_ms ms with exit status 0"

# What the API changed is kept on the `state` volume (deploy/vdet.yaml's streams_file).
podman start "$vdet" >/dev/null
python3 deploy/podman/check_stack.py --after-restart --timeout "${CI_STACK_TIMEOUT:-120}"
echo "ci-stack: ok   the zone added over the API came back after a restart"
echo "ci-stack: the single-node stack up and checked in $((SECONDS - start_up)) s"
"${COMPOSE[@]}" down -v --remove-orphans >"$LOG_DIR/compose-down.log" 2>&1

fleet_up=$SECONDS
"${FLEET[@]}" up -d --no-build "${FLEET_SERVICES[@]}"
# Shown as it runs and kept (not `tee /dev/stderr`: reopening a log file truncates it).
python3 deploy/podman/check_fleet.py --vdet http://127.0.0.1:8000 \
  --vdet http://127.0.0.1:8001 --timeout "${CI_STACK_TIMEOUT:-120}" | tee "$LOG_DIR/check-fleet.log"
owner=$(sed -n 's/^owner=//p' "$LOG_DIR/check-fleet.log")  # the node running the camera
case $owner in
  vdet-1) survivor=http://127.0.0.1:8001 ;;
  vdet-2) survivor=http://127.0.0.1:8000 ;;
  *)
    echo "ci-stack: FAIL no node named as running the camera ('$owner')" >&2
    exit 1
    ;;
esac
podman kill --signal KILL "$("${FLEET[@]}" ps -q "$owner")" >/dev/null
python3 deploy/podman/check_fleet.py --vdet "$survivor" --after-kill "$owner" \
  --timeout "${CI_STACK_TIMEOUT:-120}"
echo "ci-stack: ok   the fleet: two nodes on three NATS servers, the camera moved off a killed node"
echo "ci-stack: passed in $((SECONDS - start_all)) s (the fleet up and checked in $((SECONDS - fleet_up)) s)"
