import json
import sys
import time

from launcher.hardware import host
from launcher.hardware.__main__ import main
from launcher.hardware._proc import module_installed, run_command


def test_run_command_ok():
    res = run_command([sys.executable, "-c", "import os; print(os.environ['LC_ALL'])"], 10)
    assert res.ok and res.stdout.strip() == "C"


def test_run_command_times_out_without_raising():
    t0 = time.monotonic()
    res = run_command([sys.executable, "-c", "import time; time.sleep(30)"], 0.5)
    assert res.failure == "timeout" and not res.ok
    assert time.monotonic() - t0 < 10
    assert "no answer" in res.describe()


def test_run_command_missing_tool():
    res = run_command(["radiance-no-such-tool-xyz"], 1)
    assert res.failure == "not_found" and res.describe() == "radiance-no-such-tool-xyz: not found"


def test_run_command_nonzero_exit_is_described():
    res = run_command([sys.executable, "-c", "import sys; sys.exit('boom')"], 10)
    assert res.returncode == 1 and res.describe().endswith("exited 1: boom")


def test_module_installed_does_not_import():
    assert module_installed("json")
    assert not module_installed("radiance_no_such_module_xyz")


def test_meminfo_and_groups(fixtures):
    mem = host.parse_meminfo((fixtures / "cpu_only/proc/meminfo").read_text())
    assert mem["MemTotal"] == 8131640 * 1024
    groups = host.parse_group_file("render:x:992:alice,bob\nvideo:x:44:\n# comment\nbroken\n")
    assert groups == {"render": (992, ["alice", "bob"]), "video": (44, [])}
    info = host.probe_host(fixtures / "two_gfx1201", user_groups=["video"])
    assert info.missing_gpu_groups == ["render"]


def test_main_prints_json(fixtures, capsys):
    assert main(["--json", "--root", str(fixtures / "mi300x_gfx942")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["platform"] == "rocm" and len(data["gpus"]) == 8


def test_main_prints_text(fixtures, capsys):
    assert main(["--root", str(fixtures / "two_gfx1201")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("platform: rocm") and "GPU 1 (AMD GPU 0x7550, gfx1201): 15.9 GiB" in out
