"""images/Dockerfile.rocm's own layers on a real Docker engine, built on the CPU engine image (the
`rocm_layers_image` fixture): labels, radiance's wheel, and the Triton cache its AOT step filled for
gfx1201. The same image serves the tiny CPU profile through radiance-engine in test_compose_cpu.py
(one bring-up for both images)."""
from __future__ import annotations

import json

import pytest

from launcher import images, platforms
from radiance.versions import RADIANCE_VERSION, VLLM_VERSION

pytestmark = pytest.mark.docker


def test_labels_say_rocm_and_the_arch(docker_client, rocm_layers_image):
    labels = images.labels_of(docker_client, rocm_layers_image)
    assert labels["radiance.platform"] == platforms.ROCM.name
    assert labels["radiance.arch"] == "gfx1201"
    assert labels["radiance.version"] == RADIANCE_VERSION and labels["radiance.vllm-version"] == VLLM_VERSION
    cfg = docker_client.images.get(rocm_layers_image).attrs["Config"]
    assert cfg["User"] == "radiance" and cfg["Entrypoint"] in (None, [])
    assert "RADIANCE_PLATFORM=rocm" in cfg["Env"]


def test_kernels_compiled_for_gfx1201_into_the_image_cache(docker_client, rocm_layers_image):
    """Every shipped kernel is in TRITON_CACHE_DIR as a gfx1201 HIP binary, owned by the image's user,
    and radiance is the wheel this checkout built (its launcher has the platform table)."""
    code = (
        "import glob, json, os, radiance, vllm, launcher.platforms as p\n"
        "d = os.environ['TRITON_CACHE_DIR']\n"
        "metas = [json.load(open(f)) for f in glob.glob(d + '/*/*.json') if not os.path.basename(f).startswith('__grp')]\n"
        "print(json.dumps({'targets': sorted({(m['target']['backend'], m['target']['arch']) for m in metas}),\n"
        "  'kernels': sorted({m['name'] for m in metas}), 'hsaco': len(glob.glob(d + '/*/*.hsaco')),\n"
        "  'writable': os.access(d, os.W_OK), 'vllm': vllm.__version__, 'names': p.NAMES}))\n")
    out = docker_client.containers.run(rocm_layers_image, ["python3", "-c", code], remove=True)
    got = json.loads(out.decode().strip().splitlines()[-1])
    assert got["targets"] == [["hip", "gfx1201"]]
    assert got["hsaco"] >= len(got["kernels"]) > 0
    # the shipped kernel families, each compiled at least once (the same list `radiance check` builds)
    from radiance.kernels.aot import KERNEL_MODULES

    families = {m.rsplit(".", 1)[-1] for m in KERNEL_MODULES}
    assert all(any(f in k for k in got["kernels"]) for f in families), (families, got["kernels"])
    assert got["writable"] and got["vllm"].startswith(VLLM_VERSION)
    assert got["names"] == list(platforms.NAMES)
