"""launcher.images without an engine: tags, build args, the build context, and the progress
state read from build/pull streams (fed recorded events; a fake client stands in for the SDK)."""
from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from rich.console import Console

from launcher import images
from launcher.errors import LauncherError, UsageError
from radiance.versions import RADIANCE_VERSION, VLLM_TAG, VLLM_VERSION

REPO = Path(__file__).resolve().parents[2]


def test_tag_encodes_platform_arch_and_both_versions():
    assert images.image_tag("rocm", "gfx942") == f"radiance:{RADIANCE_VERSION}-vllm{VLLM_VERSION}-rocm-gfx942"
    assert images.image_tag("rocm").endswith("-rocm-gfx1201")
    assert images.image_tag("cuda").endswith("-cuda-sm90")
    assert images.image_tag("cpu", "x86_64", radiance_version="9.9", vllm_version="1.0") == \
        "radiance:9.9-vllm1.0-cpu-x86_64"
    assert images.image_tag("cpu", "a/b:c", repository="r") == "r:" + f"{RADIANCE_VERSION}-vllm{VLLM_VERSION}-cpu-a_b_c"
    with pytest.raises(ValueError):
        images.image_tag("tpu")


def test_build_args():
    assert images.build_args("rocm", "gfx942") == {
        "RADIANCE_VERSION": RADIANCE_VERSION, "VLLM_VERSION": VLLM_VERSION, "VLLM_TAG": VLLM_TAG,
        "ARCH": "gfx942", "GPU_ARCH": "gfx942"}
    cpu = images.build_args("cpu", base_image="radiance-base:bookworm")
    assert cpu["BASE_IMAGE"] == "radiance-base:bookworm" and "GPU_ARCH" not in cpu


def test_unknown_gpu_arch_is_a_usage_error():
    images.check_arch("rocm", "gfx942")
    images.check_arch("cpu", "anything")
    with pytest.raises(UsageError, match="gfx1201"):
        images.check_arch("rocm", "gfx1100")
    with pytest.raises(UsageError):
        images.check_arch("cuda", "gfx942")


def test_profile_image_wins(tmp_path):
    from launcher.profile import load_profile

    profile = load_profile(REPO / "profiles" / "tiny-cpu.yaml")
    assert images.resolve(profile) == ("cpu", images.default_arch("cpu"), images.image_tag("cpu"))
    pinned = profile.model_copy(update={"runtime": profile.runtime.model_copy(update={"image": "mine:1"})})
    assert images.resolve(pinned)[2] == "mine:1"


def test_context_puts_the_wheelhouse_in_place(tmp_path):
    wh = tmp_path / "wh"
    wh.mkdir()
    (wh / "pkg-1.0-py3-none-any.whl").write_bytes(b"wheel")
    (wh / "notes.txt").write_text("not a wheel")
    ctx = images.build_context(REPO, "images/Dockerfile.cpu", wh)
    with ctx, tarfile.open(fileobj=ctx) as tar:
        names = tar.getnames()
        member = tar.getmember("images/wheelhouse/pkg-1.0-py3-none-any.whl")
        assert tar.extractfile(member).read() == b"wheel"
        assert member.mtime == 0 and member.uid == 0
    assert "images/wheelhouse/notes.txt" not in names
    assert "pyproject.toml" in names and "images/Dockerfile.cpu" in names
    assert not any(n.startswith("tests/") for n in names)


def test_empty_wheelhouse_is_refused(tmp_path):
    with pytest.raises(images.ImageError, match="no wheels"):
        images.context_files(REPO, "images/Dockerfile.cpu", tmp_path)


BUILD_EVENTS = [
    {"stream": "Step 1/3 : ARG BASE_IMAGE=debian\n"},
    {"stream": "Step 2/3 : FROM ${BASE_IMAGE}\n"},
    {"status": "Pulling fs layer", "id": "aaa111", "progressDetail": {}},
    {"status": "Downloading", "id": "aaa111", "progressDetail": {"current": 50, "total": 200}},
    {"status": "Download complete", "id": "aaa111", "progressDetail": {}},
    {"stream": " ---> 1234\n"},
    {"stream": "Step 3/3 : RUN make\n"},
    {"stream": "building...\nstill building\n"},
    {"aux": {"ID": "sha256:feed"}},
    {"stream": "Successfully built feed\n"},
]


def test_stream_state_follows_steps_layers_and_the_image_id():
    state = images.StreamState()
    for ev in BUILD_EVENTS[:4]:
        state.feed(ev)
    assert (state.step, state.steps) == (2, 3)
    assert state.layers["aaa111"] == {"status": "Downloading", "current": 50, "total": 200}
    for ev in BUILD_EVENTS[4:]:
        state.feed(ev)
    assert state.layers["aaa111"]["current"] == state.layers["aaa111"]["total"] == 200
    assert state.step_text == "RUN make" and state.image_id == "feed"
    assert list(state.tail)[-3:] == ["building...", "still building", "Successfully built feed"]
    assert not state.error


class FakeAPI:
    def __init__(self, events):
        self.events = events
        self.calls = []

    def build(self, **kw):
        self.calls.append(("build", kw))
        kw["fileobj"].read()
        return iter(self.events)

    def pull(self, repository, tag=None, **kw):
        self.calls.append(("pull", repository, tag))
        return iter(self.events)


class FakeClient:
    def __init__(self, events):
        self.api = FakeAPI(events)


def _quiet_console() -> Console:
    return Console(file=io.StringIO(), force_terminal=False)


def test_build_passes_tag_args_and_dockerfile(tmp_path):
    client = FakeClient(BUILD_EVENTS)
    log = tmp_path / "build.log"
    tag = images.build("cpu", client=client, console=_quiet_console(), base_image="base:1", log_path=log)
    assert tag == images.image_tag("cpu")
    (_, kw), = client.api.calls
    assert kw["tag"] == tag and kw["dockerfile"] == "images/Dockerfile.cpu" and kw["custom_context"]
    assert kw["buildargs"]["BASE_IMAGE"] == "base:1" and kw["buildargs"]["VLLM_VERSION"] == VLLM_VERSION
    assert kw["pull"] is False  # offline hosts: the base image must be local
    assert "Step 3/3 : RUN make" in log.read_text()


def test_build_failure_raises_with_the_tail():
    events = BUILD_EVENTS[:7] + [{"stream": "E: no such package\n"},
                                 {"error": "The command returned a non-zero code: 100",
                                  "errorDetail": {"message": "The command returned a non-zero code: 100"}}]
    with pytest.raises(images.ImageError) as info:
        images.build("cpu", client=FakeClient(events), console=_quiet_console())
    assert isinstance(info.value, LauncherError)
    assert "non-zero code: 100" in str(info.value) and "E: no such package" in str(info.value)


def test_pull_splits_registry_port_from_tag():
    client = FakeClient([{"status": "Downloading", "id": "l1", "progressDetail": {"current": 1, "total": 2}},
                         {"status": "Pull complete", "id": "l1", "progressDetail": {}}])
    images.pull("reg:5000/radiance:1.0", client=client, console=_quiet_console())
    assert client.api.calls == [("pull", "reg:5000/radiance", "1.0")]
    assert images._split_ref("reg:5000/radiance") == ("reg:5000/radiance", "latest")


def test_iter_lines_rejoins_split_chunks():
    assert list(images.iter_lines([b"a\nb", b"c\n", b"d"])) == ["a", "bc", "d"]
