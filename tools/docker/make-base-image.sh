#!/usr/bin/env bash
# Build the Debian bookworm base image from Debian packages alone (no registry needed):
#   debootstrap --variant=minbase bookworm DIR ; tar -C DIR -c . | docker import - radiance-base:bookworm
# Skips the work when the image already exists (about 3 min otherwise). Idempotent.
#   tools/docker/make-base-image.sh [TAG]            default TAG: radiance-base:bookworm
set -euo pipefail

TAG=${1:-${RADIANCE_BASE_IMAGE:-radiance-base:bookworm}}
SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "base image $TAG already present"
  exit 0
fi

if ! command -v debootstrap >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
fi

ROOT=$(mktemp -d /var/tmp/radiance-rootfs.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
echo "debootstrap $SUITE into $ROOT (a few minutes)"
debootstrap --variant=minbase "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 || {
  tail -n 30 "$ROOT.log" >&2; exit 1; }
rm -f "$ROOT.log"
# apt inside builds should not keep package caches in layers.
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
tar -C "$ROOT" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' \
  - "$TAG" >/dev/null
echo "base image $TAG: $(docker image inspect "$TAG" --format '{{.Size}}') bytes"
