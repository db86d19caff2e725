"""The CPU image on a real Docker engine: built offline with the launcher's build path, the
engine run in it by the docker runtime, a completion from real vLLM (the tiny Qwen3-Next with
its MTP drafter), then a drained stop that leaves nothing behind."""
from __future__ import annotations

import time

import pytest

from docker_helpers import wait_for
from launcher import engine_args, engine_link, images
from launcher.profile import load_profile
from launcher.runtime.base import EngineSpec
from launcher.runtime.docker import LABEL_DEPLOYMENT, DockerEngine
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
    assert cfg["Healthcheck"]["Test"][-2:] == ["radiance-engine", "--health"]


def test_image_has_no_wheelhouse_and_imports_qwen35(docker_client, cpu_image):
    """The engine as `make install` builds it: no wheels left behind, no torchaudio (transformers would
    import it), and vLLM's Qwen3.5 model code importable (it needs a torchvision that loads)."""
    code = ("import importlib.util as u, os, vllm, radiance, vllm.model_executor.models.qwen3_5; "
            "print(os.path.exists('/wheels'), u.find_spec('torchaudio') is None, vllm.__version__, "
            # the trained tiny models its profiles name resolve in the image alone (Kubernetes: no mount)
            "os.path.exists('/app/models/tiny-qwen3.5-trained/model.safetensors'))")
    out = docker_client.containers.run(cpu_image, ["python", "-c", code], remove=True,
                                       environment={"VLLM_TARGET_DEVICE": "cpu"})
    assert out.decode().split()[-4:] == ["False", "True", VLLM_VERSION, "True"]


def test_engine_in_container_serves_and_stops_clean(docker_client, cpu_image, tiny_model, tmp_path):
    """The docker runtime's engine: no port at all, its socket in our private directory (the container
    runs as the image's user, with our group), its key required on /v1."""
    import httpx

    profile = load_profile("profiles/tiny-cpu.yaml")
    sock_dir = engine_link.private_socket_dir(group_access=True)
    sock = str(sock_dir / engine_link.SOCKET_NAME)
    key = engine_link.new_key()
    cfg = engine_args.build(profile, platform="cpu", uds=sock, engine_key=key, model_arg=str(tiny_model),
                            model_dir=tiny_model)
    deployment = f"test-docker-{sock_dir.name}"
    spec = EngineSpec(deployment=deployment, server_args=cfg.server_args, env=cfg.env, socket_dir=sock_dir,
                      platform="cpu", log_path=tmp_path / "engine.log", model_dir=tiny_model, image=cpu_image,
                      secret_env={**cfg.secret_env, "HF_TOKEN": "hf_not_a_real_token"})
    runtime = DockerEngine(docker_client)
    handle = runtime.start(spec)
    http = httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://engine", timeout=60)
    try:
        container = docker_client.containers.get(handle.ident)
        assert container.labels[LABEL_DEPLOYMENT] == deployment
        assert not container.attrs["HostConfig"].get("PortBindings")
        assert container.attrs["HostConfig"]["IpcMode"] == "host"

        def healthy():
            assert runtime.alive(handle), "engine container exited:\n" + "\n".join(list(runtime.logs(handle))[-40:])
            try:
                return http.get("/health").status_code == 200
            except httpx.TransportError:
                return False

        t0 = time.monotonic()
        wait_for(healthy, 900, "the engine's /health over its socket")
        load_s = time.monotonic() - t0
        assert http.get("/v1/models").status_code == 401          # the key is the second lock
        auth = {"Authorization": f"Bearer {key}"}
        r = http.post("/v1/completions", headers=auth, json={
            "model": profile.served_name(), "prompt": "def fibonacci(n):", "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["completion_tokens"] > 0 and isinstance(body["choices"][0]["text"], str)
        print(f"\n[docker] engine healthy after {load_s:.0f} s; completion {body['choices'][0]['text']!r}")

        # The image's HEALTHCHECK (radiance-engine --health, over the same socket) agrees.
        def docker_says_healthy():
            container.reload()
            return container.attrs["State"].get("Health", {}).get("Status") == "healthy"
        wait_for(docker_says_healthy, 60, "docker's health status")
        # The plugin ran inside the container and the engine itself serves what it did (its /metrics):
        # nothing is written back to the host.
        metrics = http.get("/metrics").text
        rows = [ln for ln in metrics.splitlines() if ln.startswith("radiance:patch_status{")]
        assert any('feature="dynamic_draft"' in ln and 'status="applied"' in ln for ln in rows), rows[:8]
        assert "radiance:draft_steps_total" in metrics
        assert any("vllm" in line.lower() for line in runtime.logs(handle))
    finally:
        http.close()
        runtime.stop(handle, timeout=30)
        engine_link.remove_socket_dir(sock_dir)
    assert not runtime.alive(handle)
    assert runtime.containers(deployment) == []
    text = spec.log_path.read_text()
    assert "hf_not_a_real_token" not in text and key not in text
    assert "Application startup complete" in text or "Starting vLLM" in text
