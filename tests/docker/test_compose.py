"""compose.yaml and its platform fragments: valid against the Compose specification's JSON schema,
and saying what the appliance needs (ports on 127.0.0.1, gate before ready, drain time)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest
import yaml

from launcher import images
from radiance import envs
from radiance.versions import RADIANCE_VERSION, VLLM_VERSION

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose.yaml"
FRAGMENTS = {p: REPO / "images" / "compose" / f"{p}.yaml" for p in ("rocm", "cuda", "cpu")}


def compose_schema() -> dict:
    # The Compose specification's schema (compose-spec/compose-spec, schema/compose-spec.json,
    # Apache-2.0), as vendored with its licence by the check-jsonschema package.
    pytest.importorskip("check_jsonschema", reason="pip install check-jsonschema (ships the compose-spec schema)")
    ref = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    return json.loads(ref.read_text())


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _duration_s(text: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    total = 0.0
    for value, unit in re.findall(r"([\d.]+)(ms|us|h|m|s)", text):
        total += float(value) * units[unit]
    return total


@pytest.mark.parametrize("path", [COMPOSE, *FRAGMENTS.values()], ids=lambda p: p.name)
def test_valid_against_the_compose_spec_schema(path):
    import jsonschema

    schema = compose_schema()
    cls = jsonschema.validators.validator_for(schema)
    errors = sorted(cls(schema).iter_errors(load(path)), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_the_schema_check_catches_a_broken_file():
    import jsonschema

    schema = compose_schema()
    bad = load(COMPOSE)
    bad["services"]["gateway"]["depends_on"]["engine"]["condition"] = "service_ready"
    assert list(jsonschema.validators.validator_for(schema)(schema).iter_errors(bad))


def test_engine_publishes_nothing_gateway_only_loopback():
    services = load(COMPOSE)["services"]
    assert "ports" not in services["engine"]
    for frag in FRAGMENTS.values():
        assert "ports" not in load(frag)["services"]["engine"]
    assert services["gateway"]["ports"] == ["127.0.0.1:${RADIANCE_PORT:-8000}:8000"]


def test_gateway_waits_for_a_healthy_engine_and_is_healthy_only_when_ready():
    gw = load(COMPOSE)["services"]["gateway"]
    assert gw["depends_on"] == {"engine": {"condition": "service_healthy"}}
    assert "/v1/health/ready" in " ".join(gw["healthcheck"]["test"])
    assert "curl" not in " ".join(gw["healthcheck"]["test"])
    cmd = gw["command"]
    assert cmd[:2] == ["radiance", "gateway"] and "${RADIANCE_PROFILE:-profiles/tiny-cpu.yaml}" in cmd
    assert cmd[cmd.index("--engine-url") + 1] == "unix:/var/cache/radiance/run/engine.sock"


def test_engine_reachable_only_through_the_shared_socket_volume():
    """No TCP door to the engine (vLLM's key alone leaves /invocations open): its socket and its fresh key
    live in a volume only the gateway also mounts."""
    doc = load(COMPOSE)
    engine, gateway = doc["services"]["engine"], doc["services"]["gateway"]
    assert "expose" not in engine and "ports" not in engine
    run = "engine-run:/var/cache/radiance/run"
    assert run in engine["volumes"] and run in gateway["volumes"] and "engine-run" in doc["volumes"]
    assert engine["environment"]["RADIANCE_ENGINE_UDS"] == "/var/cache/radiance/run/engine.sock"
    key_file = engine["environment"]["RADIANCE_ENGINE_KEY_FILE"]
    assert gateway["command"][gateway["command"].index("--engine-key-file") + 1] == key_file
    for name in ("RADIANCE_ENGINE_UDS", "RADIANCE_ENGINE_KEY_FILE"):
        assert name in envs.KNOBS
    # the gateway gets the user's API key when the profile names it (server.api_key_env)
    assert gateway["environment"]["RADIANCE_API_KEY"] == "${RADIANCE_API_KEY:-}"


def test_profile_default_matches_the_knob():
    default = envs.KNOBS["RADIANCE_PROFILE"].default
    assert f"${{RADIANCE_PROFILE:-{default}}}" in load(COMPOSE)["services"]["engine"]["command"]
    assert f"${{RADIANCE_PORT:-{envs.KNOBS['RADIANCE_PORT'].default}}}" in \
        load(COMPOSE)["services"]["gateway"]["ports"][0]


def test_stop_grace_period_covers_the_drain_timeout():
    drain = float(envs.KNOBS["RADIANCE_DRAIN_TIMEOUT"].default)
    services = load(COMPOSE)["services"]
    for name in ("engine", "gateway"):
        assert _duration_s(services[name]["stop_grace_period"]) > drain, name
    assert services["gateway"]["environment"]["RADIANCE_DRAIN_TIMEOUT"] == "${RADIANCE_DRAIN_TIMEOUT:-30}"


def test_named_volumes_for_the_caches():
    doc = load(COMPOSE)
    mounts = {v.split(":")[1]: v.split(":")[0] for v in doc["services"]["engine"]["volumes"]}
    for path in ("/var/cache/radiance/hf", "/var/cache/radiance/vllm", "/var/cache/radiance/triton"):
        assert mounts[path] in doc["volumes"], path


def test_amd_is_the_default_platform():
    for svc in ("engine", "gateway"):
        assert load(COMPOSE)["services"][svc]["extends"]["file"] == "images/compose/${RADIANCE_PLATFORM:-rocm}.yaml"
    rocm = load(FRAGMENTS["rocm"])["services"]["engine"]
    assert set(rocm["devices"]) == {"/dev/kfd:/dev/kfd", "/dev/dri:/dev/dri"}
    assert set(rocm["group_add"]) == {"video", "render"}
    assert rocm["security_opt"] == ["seccomp=unconfined"]
    nvidia = load(FRAGMENTS["cuda"])["services"]["engine"]
    assert nvidia["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert "devices" not in nvidia and "devices" not in load(FRAGMENTS["cpu"])["services"]["engine"]


@pytest.mark.parametrize("platform", FRAGMENTS)
def test_fragment_images_and_build_args_agree_with_the_launcher(platform):
    frag = load(FRAGMENTS[platform])["services"]
    tag = images.image_tag(platform)
    for svc in ("engine", "gateway"):
        assert frag[svc]["image"] == f"${{RADIANCE_IMAGE:-{tag}}}"
    build = frag["engine"]["build"]
    assert build["dockerfile"] == images.dockerfile_for(platform)
    assert (FRAGMENTS[platform].parent / build["context"]).resolve() == REPO
    assert build["args"]["RADIANCE_VERSION"] == RADIANCE_VERSION
    assert build["args"]["VLLM_VERSION"] == VLLM_VERSION
    if platform != "cpu":
        assert build["args"]["GPU_ARCH"] == images.default_arch(platform)
    assert frag["engine"]["environment"]["RADIANCE_PLATFORM"] == platform


def _compose_cli() -> list[str] | None:
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


@pytest.mark.skipif(_compose_cli() is None, reason="neither `docker compose` nor docker-compose installed")
@pytest.mark.parametrize("platform", FRAGMENTS)
def test_compose_config_resolves(platform, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RADIANCE_", "COMPOSE_"))}
    env.update(RADIANCE_PLATFORM=platform, RADIANCE_PORT="18123")
    proc = subprocess.run([*_compose_cli(), "-f", str(COMPOSE), "config"], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    engine, gateway = cfg["services"]["engine"], cfg["services"]["gateway"]
    assert engine["image"] == gateway["image"] == images.image_tag(platform)
    assert engine["environment"]["RADIANCE_PLATFORM"] == platform
    published = gateway["ports"][0]
    if isinstance(published, dict):  # compose v2 prints the long syntax
        assert (published["host_ip"], str(published["published"])) == ("127.0.0.1", "18123")
    else:
        assert published.startswith("127.0.0.1:18123:8000")
    assert ("devices" in engine) == (platform == "rocm")
