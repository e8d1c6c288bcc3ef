#!/usr/bin/env bash
# Build the compose stack's images with Podman from Debian packages, with no container
# registry: for hosts without Docker, or that cannot reach Docker Hub. From the repository root:
#   deploy/podman/build-images.sh          # then see deploy/README.md, "With Podman"
# Five images, in this order:
#   localhost/vdet-base:bookworm        Debian 12 with Python 3.11 and venv (mmdebstrap), standing in
#                                       for python:3.11-slim-bookworm, Dockerfile.cpu's base
#   vdet:cpu                            deploy/Dockerfile.cpu, unchanged, on that base
#   localhost/vdet-camera:bookworm      the demo camera: GStreamer's RTSP server (camera.Containerfile)
#   localhost/vdet-prometheus:bookworm  Debian's Prometheus (prometheus.Containerfile)
#   localhost/vdet-nats:2.15.1          the fleet stack's NATS server (nats.Containerfile)
# The camera, Prometheus and NATS build while vdet's image does; each build's output goes to
# $VDET_PODMAN_LOG_DIR (default: a new temporary folder), and a failed build's is printed.
# Needs root (or mmdebstrap's unshare mode), podman, runc and mmdebstrap; pip and apt inside
# the builds reach PyPI and Debian through the host's network and trust its CA bundle.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=deploy/podman/podman-env.sh
. deploy/podman/podman-env.sh

SUITE=bookworm
BASE_IMAGE=localhost/vdet-base:$SUITE
NATS_VERSION=2.15.1  # nats.Containerfile's default, docker-compose.fleet.yml's nats tag
LOG_DIR=${VDET_PODMAN_LOG_DIR:-$(mktemp -d -t vdet-podman-build.XXXXXX)}
mkdir -p "$LOG_DIR"
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
# --format docker keeps HEALTHCHECK (the OCI image format has no field for it); the host's
# network and CA bundle let pip and apt inside the build reach their registries as the host
# does (through a TLS-inspecting proxy too).
BUILD=(podman build --format docker --network=host --layers=false)
if [[ -f $CA_BUNDLE ]]; then
  BUILD+=(-v "$CA_BUNDLE:$CA_BUNDLE:ro")
fi

step() { # step NAME COMMAND...: run it with its output in $LOG_DIR/NAME.log, timed
  local name=$1 start=$SECONDS
  shift
  if "$@" >"$LOG_DIR/$name.log" 2>&1; then
    echo "build-images: $name built in $((SECONDS - start)) s"
  else
    echo "build-images: $name FAILED after $((SECONDS - start)) s; its log:" >&2
    tail -n 60 "$LOG_DIR/$name.log" >&2
    return 1
  fi
}

base() {
  # The host's Debian sources when it is a Debian 12 host (its mirror or proxy), else
  # mmdebstrap's default mirror. The dpkg options stay in the image (dpkg.cfg.d), for the
  # camera's and Prometheus' apt-get too: documentation is left out, as in python:*-slim, and
  # dpkg does not sync every file it unpacks (as in Docker's Debian images), which would make
  # it wait on the disk that the other builds are writing to.
  local sources=()
  if [[ -f /etc/apt/sources.list.d/debian.sources ]] && grep -qs "$SUITE" /etc/os-release; then
    sources=(/etc/apt/sources.list.d/debian.sources)
  fi
  mmdebstrap --variant=minbase --mode=auto \
    --include=python3,python3-venv,python-is-python3,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --dpkgopt=force-unsafe-io \
    "$SUITE" - "${sources[@]}" |
    podman import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["python3"]' - "$BASE_IMAGE"
}

vdet_cpu() {
  "${BUILD[@]}" --build-arg "PYTHON_IMAGE=$BASE_IMAGE" -f deploy/Dockerfile.cpu -t vdet:cpu .
}

stack_parts() {
  # The camera's build context is only the tests' RTSP server script.
  local context
  context=$(mktemp -d -t vdet-camera-context.XXXXXX)
  cp tests/support/rtsp_server.py "$context/"
  "${BUILD[@]}" --build-arg "BASE_IMAGE=$BASE_IMAGE" -f deploy/podman/camera.Containerfile \
    -t "localhost/vdet-camera:$SUITE" "$context"
  "${BUILD[@]}" --build-arg "BASE_IMAGE=$BASE_IMAGE" -f deploy/podman/prometheus.Containerfile \
    -t "localhost/vdet-prometheus:$SUITE" "$context"
  "${BUILD[@]}" --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "NATS_VERSION=$NATS_VERSION" \
    -f deploy/podman/nats.Containerfile \
    -t "localhost/vdet-nats:$NATS_VERSION" "$context"
  rm -rf "$context"
}

# A rebuild moves each tag to a new image and leaves the one before untagged ("dangling"): about
# 3 GB a build, never used again. Pruned before the builds (what an earlier, interrupted run
# left) and after them, so repeated builds on one host do not fill its disk.
prune_dangling() { podman image prune -f >/dev/null; }
prune_dangling
step base base
step camera-prometheus-nats stack_parts &
parts=$!
step vdet-cpu vdet_cpu || { wait "$parts" || true; exit 1; }
wait "$parts"
prune_dangling
