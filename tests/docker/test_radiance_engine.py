"""images/radiance-engine, the compose engine's entry point, outside a container: its health check
probes a real socket, and its translation of a profile serves on the socket with a fresh key."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import socket
import threading
from pathlib import Path

import pytest

from launcher import engine_link

REPO = Path(__file__).resolve().parents[2]


def _module():
    loader = importlib.machinery.SourceFileLoader("radiance_engine", str(REPO / "images" / "radiance-engine"))
    spec = importlib.util.spec_from_loader("radiance_engine", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _serve_once(path: str, status: bytes) -> threading.Thread:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def run():
        conn, _ = srv.accept()
        with conn, srv:
            conn.recv(1024)
            conn.sendall(b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\n\r\n")
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("status,code", [(b"200 OK", 0), (b"503 Service Unavailable", 1)])
def test_health_over_the_socket(tmp_path, status, code):
    mod = _module()
    d = engine_link.private_socket_dir()
    try:
        sock = str(d / "engine.sock")
        t = _serve_once(sock, status)
        assert mod.health(sock, 0) == code
        t.join(5)
        os.unlink(sock)
        assert mod.health(sock, 0) == 1     # nobody listening
    finally:
        engine_link.remove_socket_dir(d)


def test_argv_up_to_the_exec_serves_on_the_socket_with_a_fresh_key(tmp_path, monkeypatch):
    """Stops at the exec: what vLLM would get."""
    mod = _module()
    seen = {}

    def fake_exec(path, argv, env):  # the process boundary; vLLM itself runs in the compose test
        seen.update(argv=argv, env=env)
        raise SystemExit(0)

    monkeypatch.setattr(mod.os, "execve", fake_exec)
    monkeypatch.chdir(REPO)
    sock, key_file = tmp_path / "engine.sock", tmp_path / "engine.key"
    sock.write_text("")  # a socket left by the previous run of the container
    with pytest.raises(SystemExit):
        mod.main(["profiles/tiny-cpu.yaml", "--uds", str(sock), "--key-file", str(key_file)])
    argv = seen["argv"]
    assert argv[argv.index("--uds") + 1] == str(sock) and "--port" not in argv and "--host" not in argv
    key = key_file.read_text()
    assert len(key) >= 32 and key_file.stat().st_mode & 0o777 == 0o600
    assert seen["env"]["VLLM_API_KEY"] == key and key not in " ".join(argv)
    assert not sock.exists()


def test_a_bad_profile_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    """compose's engine reads the profile itself: a mistake there must read as `radiance up`'s does."""
    mod = _module()
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "profiles" / "tiny-cpu.yaml").read_text().replace("tp: 1", "tp: zero"))
    monkeypatch.setenv("RADIANCE_PLATFORM", "cpu")
    assert mod.main([str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {bad}:") and "parallel.tp" in err[0] and "fix:" in err[0]


def test_the_platform_default_is_the_knob(monkeypatch, capsys):
    mod = _module()
    monkeypatch.setenv("RADIANCE_PLATFORM", "tpu")
    assert mod.main(["profiles/tiny-cpu.yaml"]) == 2
    assert "RADIANCE_PLATFORM='tpu'" in capsys.readouterr().err
