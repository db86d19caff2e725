import json

import pytest

from launcher.hardware import nvidia
from launcher.hardware._proc import CommandResult
from launcher.hardware.types import ProbeLog

MIB = 1024**2


def test_parse_nvidia_smi_csv_h200(fixtures):
    gpus = nvidia.parse_nvidia_smi_csv((fixtures / "h200_nvidia_smi/commands/nvidia-smi.txt").read_text())
    assert [g.index for g in gpus] == list(range(8))
    g = gpus[0]
    assert (g.vendor, g.name, g.arch, g.driver) == ("nvidia", "NVIDIA H200", "sm90", "570.124.06")
    assert g.source == "nvidia-smi"
    assert g.memory_total_bytes == 143771 * MIB
    assert g.memory_free_bytes == 143187 * MIB
    assert g.uuid == "GPU-3b9f6c1e-8a2d-4f7e-9c15-2d7e5a1b0c41"
    assert g.pci_bus_id == "0000:18:00.0"  # NVIDIA's 8-digit domain shortened to sysfs form
    assert gpus[5].memory_free_bytes == 20391 * MIB


def test_parse_nvidia_smi_csv_not_available_values_and_short_field_list():
    fields = tuple(f for f in nvidia.SMI_FIELDS if f != "compute_cap")
    text = "0, GPU-aaaa, NVIDIA GH200 480GB, 97871, [N/A], 550.54.15, 00000009:01:00.0\nWARNING: something odd\n\n"
    (g,) = nvidia.parse_nvidia_smi_csv(text, fields)
    assert g.memory_free_bytes is None
    assert g.arch == "unknown"
    assert g.pci_bus_id == "0009:01:00.0"


def test_parse_nvml_records(fixtures):
    data = json.loads((fixtures / "h200_nvidia_smi/nvml.json").read_text())
    gpus = nvidia.parse_nvml_records(data)
    assert len(gpus) == 8
    assert gpus[0].arch == "sm90" and gpus[0].source == "nvml" and gpus[0].driver == "570.124.06"
    assert gpus[5].memory_free_bytes == 20391 * MIB
    assert gpus[0].pci_bus_id == "0000:18:00.0"


def test_probe_replays_nvidia_smi(fixtures, replay):
    runner = replay(fixtures / "h200_nvidia_smi")
    log = ProbeLog()
    gpus = nvidia.probe(fixtures / "h200_nvidia_smi", runner=runner, log=log)
    assert len(gpus) == 8 and {g.source for g in gpus} == {"nvidia-smi"}
    assert runner.calls == [
        (
            "nvidia-smi",
            "--query-gpu=index,uuid,name,memory.total,memory.free,driver_version,pci.bus_id,compute_cap",
            "--format=csv,noheader,nounits",
        )
    ]
    assert [(o.name, o.status) for o in log.outcomes] == [("nvidia.nvml", "skipped"), ("nvidia.nvidia-smi", "ok")]
    assert log.warnings == []


def test_old_driver_without_compute_cap_is_retried(fixtures, replay):
    full = (fixtures / "h200_nvidia_smi/commands/nvidia-smi.txt").read_text().splitlines()
    short = "\n".join(line.rsplit(",", 1)[0] for line in full) + "\n"
    rejected = CommandResult(("nvidia-smi",), 2, 'Field "compute_cap" is not a valid field to query.\n\n', "")
    runner = replay(None, {"nvidia-smi": [rejected, CommandResult(("nvidia-smi",), 0, short, "")]})
    log = ProbeLog()
    gpus = nvidia.probe(fixtures / "h200_nvidia_smi", runner=runner, log=log)
    assert len(gpus) == 8 and gpus[0].arch == "unknown"
    assert "compute_cap" not in runner.calls[1][1]
    assert "too old" in log.outcomes[-1].detail


@pytest.mark.parametrize(
    "result, status",
    [
        (CommandResult(("nvidia-smi",), None, failure="timeout"), "timeout"),
        (
            CommandResult(
                ("nvidia-smi",),
                9,
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                "Make sure that the latest NVIDIA driver is installed and running.\n",
            ),
            "failed",
        ),
    ],
)
def test_nvidia_smi_failure_is_a_warning(fixtures, replay, result, status):
    log = ProbeLog()
    assert nvidia.probe(fixtures / "h200_nvidia_smi", runner=replay(None, {"nvidia-smi": result}), log=log) == []
    assert log.outcomes[-1].status == status
    assert len(log.warnings) == 1 and "nvidia.nvidia-smi" in log.warnings[0]


def test_no_driver_is_quiet(tmp_path, replay):
    runner = replay(None)
    log = ProbeLog()
    assert nvidia.probe(tmp_path, runner=runner, use_library=True, log=log) == []
    assert {o.status for o in log.outcomes} == {"unavailable"}
    assert runner.calls == [] and log.warnings == []


def test_driver_loaded_but_no_tools_warns(fixtures, replay):
    log = ProbeLog()
    assert nvidia.probe(fixtures / "h200_nvidia_smi", runner=replay(None), log=log) == []
    assert any("neither NVML nor nvidia-smi" in w for w in log.warnings)


def test_nvml_library_probe(fixtures, fake_libs):
    log = ProbeLog()
    gpus = nvidia.probe(fixtures / "h200_nvidia_smi", timeout=20, use_library=True, log=log)
    assert [(o.name, o.status) for o in log.outcomes] == [("nvidia.nvml", "ok"), ("nvidia.nvidia-smi", "skipped")]
    assert [g.name for g in gpus] == ["NVIDIA H200", "NVIDIA H200"]  # bytes decoded
    assert gpus[1].pci_bus_id == "0000:2a:00.0" and gpus[1].arch == "sm90"
    assert gpus[0].driver == "570.124.06"
    assert log.warnings == []


def test_nvml_without_its_library_falls_through_quietly(fixtures, fake_libs, monkeypatch, replay):
    monkeypatch.setenv("FAKE_PYNVML", "nolib")
    log = ProbeLog()
    gpus = nvidia.probe(
        fixtures / "h200_nvidia_smi", timeout=20, use_library=True, runner=replay(fixtures / "h200_nvidia_smi"), log=log
    )
    assert log.outcomes[0].status == "unavailable"
    assert len(gpus) == 8 and gpus[0].source == "nvidia-smi"
    assert log.warnings == []
