"""deploy/k8s and `radiance export k8s`: every overlay and every shipped profile renders with the
machine's `kubectl kustomize`, validates strictly against the Kubernetes 1.32 schemas, and holds what a
live cluster would otherwise be the first to catch (no cluster runs here): selectors that match their
pods, ports that line up between probes, containers and the Service, an image that a locally built tag
satisfies, GPU requests from the profile's TP, a drain that fits the grace period."""
from __future__ import annotations

import math
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from launcher import images, k8s_export
from launcher.profile import load_profile

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
K8S_VERSION = "1.32.0"
PROFILES = sorted(p.name for p in (REPO / "profiles").glob("*.yaml"))
GPU_KEYS = {"amd.com/gpu", "nvidia.com/gpu"}


def _kubectl() -> str:
    exe = shutil.which("kubectl")
    if exe is None:
        pytest.fail("kubectl (with kustomize) is not installed: .ci/run installs it; see README 'Scaling out'")
    return exe


def render(directory: Path) -> list[dict]:
    proc = subprocess.run([_kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def _exported(tmp_path: Path, name: str, platform: str | None = None) -> tuple[Path, object, str]:
    path = REPO / "profiles" / name
    profile = load_profile(path)
    platform = platform or (profile.runtime.platform if profile.runtime.platform != "auto" else "cpu")
    out = tmp_path / f"{name}-{platform}"
    k8s_export.export(profile, str(path), out, platform=platform)
    return out, profile, platform


def _cases():
    for name in k8s_export.TREE_OVERLAYS:
        yield pytest.param(("overlay", name), id=f"overlay-{name}")
    for name in PROFILES:
        yield pytest.param(("export", name), id=f"export-{name}")


@pytest.fixture(scope="module", params=list(_cases()))
def rendered(request, tmp_path_factory):
    """(objects, profile, platform, profile text), rendered once per case for every test of the module."""
    how, name = request.param
    tmp_path = tmp_path_factory.mktemp("k8s")
    if how == "overlay":
        rel, platform = k8s_export.TREE_OVERLAYS[name]
        profile = load_profile(REPO / rel)
        text = (REPO / rel).read_text()
        docs = render(K8S / "overlays" / name)
    else:
        out, profile, platform = _exported(tmp_path, name)
        text = (REPO / "profiles" / name).read_text()
        docs = render(out)
    return docs, profile, platform, text


def test_in_tree_overlays_are_what_export_renders():
    for name in k8s_export.TREE_OVERLAYS:
        want = k8s_export.tree_overlay_files(name)
        have = {p.name: p.read_text() for p in (K8S / "overlays" / name).iterdir()}
        assert have == want, f"deploy/k8s/overlays/{name} is stale: run `python -m launcher.k8s_export`"
    assert (K8S / "base" / "profile.yaml").read_text() == (REPO / k8s_export.BASE_PROFILE).read_text()


def test_base_renders_and_validates():
    docs = render(K8S / "base")
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    assert set(by_kind(docs)) == {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget",
                                  "PersistentVolumeClaim"}


def test_every_object_validates_strictly(rendered):
    docs, *_ = rendered
    assert docs
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)  # raises on any schema error


def _matches(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def test_selectors_match_the_pods(rendered):
    docs, *_ = rendered
    k = by_kind(docs)
    (dep,) = k["Deployment"]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert _matches(dep["spec"]["selector"]["matchLabels"], pod_labels)
    (svc,) = k["Service"]
    assert _matches(svc["spec"]["selector"], pod_labels)
    (pdb,) = k["PodDisruptionBudget"]
    assert _matches(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    assert pdb["spec"]["maxUnavailable"] == 1   # a one-replica PDB that allowed none would block drains


def _containers(dep) -> dict[str, dict]:
    return {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}


def test_ports_line_up_between_service_gateway_and_probes(rendered):
    docs, *_ = rendered
    k = by_kind(docs)
    (dep,) = k["Deployment"]
    c = _containers(dep)
    assert "ports" not in c["engine"]   # the engine serves on its socket only
    gw_ports = {p["name"]: p["containerPort"] for p in c["gateway"]["ports"]}
    (svc,) = k["Service"]
    (sp,) = svc["spec"]["ports"]
    assert sp["port"] == 8000 and sp["targetPort"] in gw_ports and gw_ports[sp["targetPort"]] == 8000
    ready, live = c["gateway"]["readinessProbe"]["httpGet"], c["gateway"]["livenessProbe"]["httpGet"]
    assert ready["path"] == "/v1/health/ready" and live["path"] == "/v1/health/live"
    assert ready["port"] in gw_ports and live["port"] in gw_ports
    # the gateway listens where its Service and probes point
    cmd = c["gateway"]["command"]
    assert cmd[cmd.index("--port") + 1] == str(gw_ports[sp["targetPort"]])
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    # gateway and engine share the socket's directory, and nothing else mounts it
    sock = cmd[cmd.index("--engine-url") + 1][len("unix:"):]
    env = {e["name"]: e.get("value") for e in c["engine"]["env"]}
    assert env["RADIANCE_ENGINE_UDS"] == sock
    mounts = {name: {m["mountPath"]: m["name"] for m in cont["volumeMounts"]} for name, cont in c.items()}
    run_dir = str(Path(sock).parent)
    assert mounts["engine"][run_dir] == mounts["gateway"][run_dir]


def test_images_work_for_a_locally_built_tag(rendered):
    docs, _, platform, _ = rendered
    (dep,) = by_kind(docs)["Deployment"]
    for c in _containers(dep).values():
        assert c["image"] == images.image_tag(platform)   # the tag `radiance build` gives
        assert c["imagePullPolicy"] == "IfNotPresent"     # Always would fail with no registry
        assert not c["image"].endswith(":latest")


def test_gpus_requested_from_tp(rendered):
    docs, profile, platform, _ = rendered
    (dep,) = by_kind(docs)["Deployment"]
    c = _containers(dep)
    eng = c["engine"].get("resources", {})
    gpus = {key: v for part in ("requests", "limits") for key, v in eng.get(part, {}).items() if key in GPU_KEYS}
    if platform == "cpu":
        assert gpus == {}
    else:
        key = k8s_export.GPU_RESOURCE[platform]
        n = str(profile.parallel.tp * profile.parallel.pp)
        assert eng["requests"][key] == n and eng["limits"][key] == n and set(gpus) == {key}
    assert not any(k in GPU_KEYS for k in c["gateway"].get("resources", {}).get("limits", {}))


def test_startup_budget_and_drain_fit(rendered):
    docs, profile, _, _ = rendered
    (dep,) = by_kind(docs)["Deployment"]
    spec = dep["spec"]["template"]["spec"]
    c = _containers(dep)
    start = c["engine"]["startupProbe"]
    assert start["periodSeconds"] * start["failureThreshold"] >= profile.runtime.startup_timeout_s
    drain = float({e["name"]: e.get("value") for e in c["gateway"]["env"]}["RADIANCE_DRAIN_TIMEOUT"])
    sleep = float(c["gateway"]["lifecycle"]["preStop"]["exec"]["command"][-1])
    wait = c["engine"]["lifecycle"]["preStop"]["exec"]["command"]
    assert wait[:3] == ["radiance-engine", "--await-closed", "8000"]
    assert float(wait[wait.index("--timeout") + 1]) >= sleep + drain   # the engine outlives the drain
    assert spec["terminationGracePeriodSeconds"] >= sleep + drain + 10


def test_profile_configmap_secrets_and_claims_resolve(rendered):
    docs, profile, _, text = rendered
    k = by_kind(docs)
    (dep,) = k["Deployment"]
    spec = dep["spec"]["template"]["spec"]
    cms = {cm["metadata"]["name"]: cm for cm in k["ConfigMap"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    cm = cms[vols["profile"]["configMap"]["name"]]          # the generated (hashed) name is referenced
    assert cm["data"]["profile.yaml"] == text
    claims = {p["metadata"]["name"] for p in k["PersistentVolumeClaim"]}
    assert all(v["persistentVolumeClaim"]["claimName"] in claims for v in vols.values() if "persistentVolumeClaim" in v)
    gw_env = {e["name"]: e for e in _containers(dep)["gateway"]["env"]}
    if profile.server.api_key_env:
        ref = gw_env[profile.server.api_key_env]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "radiance-secrets", "key": "api-key", "optional": False}
    for e in (e for cont in spec["containers"] for e in cont.get("env", [])):
        if e["name"] in ("HF_TOKEN",) or e["name"] == profile.server.api_key_env:
            assert "value" not in e   # secrets only by reference


def test_export_refuses_a_foreign_directory_and_an_auto_platform(tmp_path):
    (tmp_path / "mine.txt").write_text("x")
    run = lambda *a: subprocess.run([sys.executable, "-m", "launcher", "export", "k8s", *a],  # noqa: E731
                                    capture_output=True, text=True, cwd=REPO, timeout=120)
    proc = run("profiles/tiny-cpu.yaml", "-o", str(tmp_path))
    assert proc.returncode == 2 and "not empty" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    data = yaml.safe_load((REPO / "profiles/tiny-cpu.yaml").read_text())
    data["runtime"]["platform"] = "auto"
    auto = tmp_path / "auto.yaml"
    auto.write_text(yaml.safe_dump(data))
    proc = run(str(auto), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2 and "--platform" in proc.stderr
    proc = run(str(auto), "-o", str(tmp_path / "out"), "--platform", "cuda")
    assert proc.returncode == 0, proc.stderr
    proc = run(str(auto), "-o", str(tmp_path / "out"), "--platform", "cpu")   # a previous export: rewritten
    assert proc.returncode == 0 and "cpu-x86_64" in (tmp_path / "out" / "kustomization.yaml").read_text()


def test_engine_prestop_waits_for_the_gateway_to_close():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    cmd = [sys.executable, str(REPO / "images" / "radiance-engine"), "--await-closed", str(port), "--timeout", "20"]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    assert p.poll() is None   # still waiting while the port is open
    s.close()
    assert p.wait(timeout=10) == 0 and time.monotonic() - t0 < 10
