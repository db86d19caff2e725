#!/usr/bin/env bash
# Make sure a Docker engine answers on /var/run/docker.sock; start dockerd if it does not.
# Idempotent: a running engine is left alone. Used by .ci/run, the Makefile and tests/docker.
#   tools/docker/start-dockerd.sh [--install]     (--install: apt-get docker.io when dockerd is missing)
set -euo pipefail

SOCK=${DOCKER_SOCK:-/var/run/docker.sock}
LOG=${DOCKERD_LOG:-/var/log/radiance-dockerd.log}
WAIT_S=${DOCKERD_WAIT_S:-60}

engine_up() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if engine_up; then
  echo "docker engine already running ($(docker version --format '{{.Server.Version}}'))"
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  if [[ "${1:-}" == "--install" ]]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q docker.io >/dev/null
  else
    echo "dockerd not found: run with --install, or apt-get install docker.io" >&2
    exit 1
  fi
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "the docker engine is not running and starting it needs root" >&2
  exit 1
fi

# A stale pid file from a killed daemon blocks a new one.
if [[ -f /var/run/docker.pid ]] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
  rm -f /var/run/docker.pid
fi

echo "starting dockerd (log: $LOG)"
# setsid: the daemon must outlive the shell (and the CI step) that started it.
setsid dockerd --host "unix://$SOCK" >>"$LOG" 2>&1 < /dev/null &

for _ in $(seq "$WAIT_S"); do
  if [[ -S "$SOCK" ]] && engine_up; then
    echo "docker engine up ($(docker version --format '{{.Server.Version}}'))"
    exit 0
  fi
  sleep 1
done
echo "dockerd did not answer within ${WAIT_S}s; last log lines:" >&2
tail -n 20 "$LOG" >&2
exit 1
