"""launcher.runtime.docker's container configuration, without an engine: devices per platform,
no port (the engine's socket directory mounted instead), mounts at host paths, secrets kept out of
what is returned or raised."""
from __future__ import annotations

from pathlib import Path

import pytest

from launcher.runtime import docker as rt
from launcher.runtime.base import EngineSpec


def spec(tmp_path: Path, platform: str = "cpu", **kw) -> EngineSpec:
    base = dict(deployment="tiny cpu", server_args=["--model", str(tmp_path / "m"), "--uds",
                                                    str(tmp_path / "run" / "engine.sock")],
                env={"RADIANCE_ENABLE": "1", "HF_HOME": "/host/hf"}, socket_dir=tmp_path / "run",
                platform=platform, log_path=tmp_path / "engine.log",
                model_dir=tmp_path / "m", image="radiance:test", secret_env={"HF_TOKEN": "hf_secret"})
    base.update(kw)
    return EngineSpec(**base)


def test_engine_serves_on_the_mounted_socket_with_a_group_umask():
    sock = f"{rt.RUN_DIR}/engine.sock"
    cmd = rt.engine_command(["--model", "m", "--uds", "/host/tmp/radiance-x/engine.sock"])
    assert cmd[:5] == ["sh", "-c", 'umask 0007 && exec "$@"', "radiance-engine", "python"]
    assert cmd[5:7] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[-2:] == ["--uds", sock]
    assert rt.engine_command(["--uds=/x"])[-1] == f"--uds={sock}"
    assert rt.engine_command([])[-2:] == ["--uds", sock]


def test_cpu_config(tmp_path):
    cfg = rt.container_config(spec(tmp_path), "radiance:test")
    assert "ports" not in cfg                      # nothing published: the socket is the only door
    assert cfg["group_add"] == [str(rt.os.getgid())]
    assert cfg["ipc_mode"] == "host" and cfg["init"] is True
    assert cfg["labels"][rt.LABEL_DEPLOYMENT] == "tiny cpu"
    assert cfg["name"] == "radiance-tiny-cpu-engine"
    vols = cfg["volumes"]
    assert vols[str(tmp_path / "m")] == {"bind": str(tmp_path / "m"), "mode": "ro"}
    assert vols[str(tmp_path / "run")] == {"bind": rt.RUN_DIR, "mode": "rw"}
    assert vols[rt.HF_VOLUME]["bind"] == "/var/cache/radiance/hf"
    assert vols[rt.triton_volume("radiance:test")]["bind"] == "/var/cache/radiance/triton"
    # The container's own cache paths win over host paths that leaked into the env.
    assert cfg["environment"]["HF_HOME"] == "/var/cache/radiance/hf"
    assert cfg["environment"]["RADIANCE_ENGINE_UDS"] == f"{rt.RUN_DIR}/engine.sock"
    assert "devices" not in cfg and "device_requests" not in cfg


def test_secrets_are_not_part_of_the_config(tmp_path):
    cfg = rt.container_config(spec(tmp_path), "radiance:test")
    assert "hf_secret" not in repr(cfg)
    assert rt._redact("bad token hf_secret here", spec(tmp_path)) == "bad token *** here"


def test_triton_volume_is_per_image():
    assert rt.triton_volume("radiance:0.1.0-vllm0.32.0-rocm-gfx1201") != \
        rt.triton_volume("radiance:0.1.0-vllm0.32.0-rocm-gfx942")
    assert rt.triton_volume("reg:5000/a/b:c").startswith("radiance-triton-reg-5000-a-b-c")


def test_rocm_devices_groups_seccomp(tmp_path, monkeypatch):
    monkeypatch.setattr(rt.os.path, "exists", lambda p: True)
    monkeypatch.setattr(rt, "_device_gids", lambda paths: ["44", "109"])
    cfg = rt.container_config(spec(tmp_path, "rocm"), "radiance:test")
    assert cfg["devices"] == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
    assert cfg["group_add"] == sorted({"44", "109", str(rt.os.getgid())})
    assert cfg["security_opt"] == ["seccomp=unconfined"] and cfg["ipc_mode"] == "host"


def test_rocm_without_device_nodes_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(rt.os.path, "exists", lambda p: False)
    with pytest.raises(rt.DockerRuntimeError, match="/dev/kfd"):
        rt.container_config(spec(tmp_path, "rocm"), "radiance:test")


def test_cuda_device_request(tmp_path):
    cfg = rt.container_config(spec(tmp_path, "cuda"), "radiance:test")
    (req,) = cfg["device_requests"]
    assert req["Count"] == -1 and req["Capabilities"] == [["gpu"]]


def test_device_gids_reads_the_nodes(tmp_path, monkeypatch):
    import grp

    monkeypatch.setattr(grp, "getgrnam", lambda name: (_ for _ in ()).throw(KeyError(name)))
    # No character devices under a plain directory: no groups, and no error.
    (tmp_path / "dri").mkdir()
    assert rt._device_gids((str(tmp_path / "kfd"), str(tmp_path / "dri"))) == []


def test_no_socket_directory_is_an_error(tmp_path):
    with pytest.raises(rt.DockerRuntimeError, match="socket directory"):
        rt.container_config(spec(tmp_path, socket_dir=None), "radiance:test")


def test_open_files_limit_raised(tmp_path):
    (lim,) = rt.container_config(spec(tmp_path), "radiance:test")["ulimits"]
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    expected = 65536 if hard == resource.RLIM_INFINITY else min(65536, hard)
    assert (lim["Name"], lim["Soft"], lim["Hard"]) == ("nofile", expected, expected)
