"""The CPU image on a real Docker engine: built offline with the launcher's build path, the
engine run in it by the docker runtime, a completion from real vLLM (the tiny Qwen3-Next with
its MTP drafter), then a drained stop that leaves nothing behind."""
from __future__ import annotations

import time

import pytest

from docker_helpers import free_port, http_json, wait_for
from launcher import engine_args, images
from launcher.profile import load_profile
from launcher.runtime.base import EngineSpec
from launcher.runtime.docker import LABEL_DEPLOYMENT, DockerRuntime
from radiance.versions import RADIANCE_VERSION, VLLM_VERSION

pytestmark = pytest.mark.docker


def test_image_labels(docker_client, cpu_image):
    labels = images.labels_of(docker_client, cpu_image)
    assert labels["radiance.version"] == RADIANCE_VERSION
    assert labels["radiance.vllm-version"] == VLLM_VERSION
    assert labels["radiance.platform"] == "cpu"
    assert labels["radiance.arch"] == images.default_arch("cpu")
    cfg = docker_client.images.get(cpu_image).attrs["Config"]
    assert cfg["User"] == "radiance"
    assert "/health" in " ".join(cfg["Healthcheck"]["Test"])


def test_image_has_no_wheelhouse_and_imports_qwen35(docker_client, cpu_image):
    """The engine as `make install` builds it: no wheels left behind, no torchaudio (transformers would
    import it), and vLLM's Qwen3.5 model code importable (it needs a torchvision that loads)."""
    code = ("import importlib.util as u, os, vllm, radiance, vllm.model_executor.models.qwen3_5; "
            "print(os.path.exists('/wheels'), u.find_spec('torchaudio') is None, vllm.__version__)")
    out = docker_client.containers.run(cpu_image, ["python", "-c", code], remove=True,
                                       environment={"VLLM_TARGET_DEVICE": "cpu"})
    assert out.decode().split()[-3:] == ["False", "True", VLLM_VERSION]


def test_engine_in_container_serves_and_stops_clean(docker_client, cpu_image, tiny_model, tmp_path):
    profile = load_profile("profiles/tiny-cpu.yaml")
    port = free_port()
    report_dir = tmp_path / "patches"
    cfg = engine_args.build(profile, platform="cpu", host="0.0.0.0", port=port, model_arg=str(tiny_model),
                            model_dir=tiny_model, report_dir=report_dir)
    deployment = f"test-docker-{port}"
    spec = EngineSpec(deployment=deployment, server_args=cfg.server_args, env=cfg.env, host="127.0.0.1",
                      port=port, platform="cpu", log_path=tmp_path / "engine.log", report_dir=report_dir,
                      model_dir=tiny_model, image=cpu_image, secret_env={"HF_TOKEN": "hf_not_a_real_token"})
    runtime = DockerRuntime(docker_client)
    handle = runtime.start(spec)
    try:
        container = docker_client.containers.get(handle.ident)
        assert container.labels[LABEL_DEPLOYMENT] == deployment
        bindings = container.attrs["HostConfig"]["PortBindings"][f"{port}/tcp"]
        assert bindings == [{"HostIp": "127.0.0.1", "HostPort": str(port)}]
        assert container.attrs["HostConfig"]["IpcMode"] == "host"

        def healthy():
            assert runtime.alive(handle), "engine container exited:\n" + "\n".join(list(runtime.logs(handle))[-40:])
            return http_json(f"http://127.0.0.1:{port}/health", timeout=5)[0] == 200

        t0 = time.monotonic()
        wait_for(healthy, 900, "the engine's /health")
        load_s = time.monotonic() - t0
        status, body = http_json(f"http://127.0.0.1:{port}/v1/completions",
                                 {"model": profile.served_name(), "prompt": "def fibonacci(n):", "max_tokens": 8,
                                  "temperature": 0})
        assert status == 200, body
        assert body["usage"]["completion_tokens"] > 0 and isinstance(body["choices"][0]["text"], str)
        print(f"\n[docker] engine healthy after {load_s:.0f} s; completion {body['choices'][0]['text']!r}")

        # The image's HEALTHCHECK (python, no curl) agrees.
        def docker_says_healthy():
            container.reload()
            return container.attrs["State"].get("Health", {}).get("Status") == "healthy"
        wait_for(docker_says_healthy, 60, "docker's health status")
        # The plugin ran inside the container and wrote its report through the bind mount.
        assert list(report_dir.glob("patches-*.json")), "no patch report from the engine"
        assert any("vllm" in line.lower() for line in runtime.logs(handle))
    finally:
        runtime.stop(handle, timeout=30)
    assert not runtime.alive(handle)
    assert runtime.containers(deployment) == []
    text = spec.log_path.read_text()
    assert "hf_not_a_real_token" not in text
    assert "Application startup complete" in text or "Starting vLLM" in text
