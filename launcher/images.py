"""Engine images: their names, and building or pulling them through the docker SDK.

A tag says everything that decides what is inside an image: platform, arch, vLLM version and
radiance version (``radiance:0.1.0-vllm0.32.0-rocm-gfx1201``), so a profile maps to exactly one
image and a new radiance or vLLM release never reuses a stale one. The versions come from
``radiance/versions.py`` and reach the Dockerfiles as build args, where they become labels.

Builds send a context made from the repository (filtered by ``.dockerignore``) plus, for
offline hosts, a wheelhouse placed at ``images/wheelhouse/`` inside the context; the Dockerfiles
install from those wheels in a builder stage only. Progress comes from the build and pull
streams of the docker API and is drawn as rich progress bars.
"""
from __future__ import annotations

import io
import platform as _platform
import re
import tarfile
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from launcher import platforms
from launcher.errors import LauncherError, UsageError
from radiance.versions import RADIANCE_VERSION, VLLM_TAG, VLLM_VERSION

REPOSITORY = "radiance"
PLATFORMS = platforms.NAMES
# GPU images carry AOT-compiled kernels for one arch (launcher/platforms.py says which by default).
DEFAULT_GPU_ARCH = {p.name: p.default_arch for p in platforms.PLATFORMS.values() if p.gpu}
WHEELHOUSE_IN_CONTEXT = "images/wheelhouse"
LABEL_PREFIX = "radiance."
_TAG_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")


class ImageError(LauncherError):
    """A build or pull failed; the message carries the engine's last output lines."""


def repo_root() -> Path:
    """The checkout that holds ``images/`` and ``pyproject.toml`` (the build context)."""
    return Path(__file__).resolve().parents[1]


def default_arch(platform: str) -> str:
    """rocm/cuda: the GPU arch the kernels are compiled for; cpu: the host CPU arch."""
    arch = _check_platform(platform).default_arch
    if arch:
        return arch
    machine = _platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def image_tag(platform: str, arch: str | None = None, *, repository: str = REPOSITORY,
              radiance_version: str = RADIANCE_VERSION, vllm_version: str = VLLM_VERSION) -> str:
    _check_platform(platform)
    arch = arch or default_arch(platform)
    tag = f"{radiance_version}-vllm{vllm_version}-{platform}-{arch}"
    return f"{repository}:{_TAG_SAFE.sub('_', tag)}"


def dockerfile_for(platform: str) -> str:
    """Path of the Dockerfile relative to the context root."""
    return _check_platform(platform).dockerfile


def build_args(platform: str, arch: str | None = None, base_image: str | None = None) -> dict[str, str]:
    plat = _check_platform(platform)
    arch = arch or default_arch(platform)
    args = {"RADIANCE_VERSION": RADIANCE_VERSION, "VLLM_VERSION": VLLM_VERSION, "ARCH": arch}
    if plat.vllm_from_source:
        args["VLLM_TAG"] = VLLM_TAG  # read only where the build asks for vLLM from source (VLLM_SOURCE)
    if plat.gpu:
        args["GPU_ARCH"] = arch
    if base_image:
        args["BASE_IMAGE"] = base_image
    return args


def _check_platform(platform: str) -> platforms.Platform:
    return platforms.get(platform)


# --- build context -------------------------------------------------------------------------

def read_dockerignore(root: Path) -> list[str]:
    path = root / ".dockerignore"
    if not path.is_file():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def context_files(root: Path, dockerfile: str, wheelhouse: Path | None = None) -> list[tuple[Path, str]]:
    """(host path, name in the context) for every file the build may see."""
    from docker.utils.build import exclude_paths

    files = []
    for rel in sorted(exclude_paths(str(root), read_dockerignore(root), dockerfile=dockerfile)):
        host = root / rel
        if not host.is_file() or host.is_symlink():
            continue
        if wheelhouse is not None and rel.startswith(WHEELHOUSE_IN_CONTEXT + "/") \
                and not rel.endswith("README.md"):
            continue  # the given wheelhouse replaces whatever lies in the checkout's folder
        files.append((host, rel))
    if wheelhouse is not None:
        wheels = sorted(p for p in Path(wheelhouse).iterdir()
                        if p.is_file() and p.name.endswith((".whl", ".tar.gz", ".zip")))
        if not wheels:
            raise ImageError(f"wheelhouse {wheelhouse} holds no wheels "
                             "(fill it with tools/docker/wheelhouse.sh DIR)")
        files.extend((p, f"{WHEELHOUSE_IN_CONTEXT}/{p.name}") for p in wheels)
    return files


def build_context(root: Path, dockerfile: str, wheelhouse: Path | None = None) -> IO[bytes]:
    """An uncompressed tar of the context in a temporary file, rewound (the SDK streams it)."""
    out = tempfile.TemporaryFile(prefix="radiance-context-")
    with tarfile.open(fileobj=out, mode="w") as tar:
        for host, name in context_files(root, dockerfile, wheelhouse):
            info = tar.gettarinfo(str(host), arcname=name)
            # Fixed owner and time: the context of an unchanged tree gives the same cache keys.
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with open(host, "rb") as fh:
                tar.addfile(info, fh)
    out.seek(0)
    return out


# --- progress ------------------------------------------------------------------------------

@dataclass
class StreamState:
    """What the build/pull stream has said so far (kept apart from drawing, for tests)."""
    step: int = 0
    steps: int = 0
    step_text: str = ""
    image_id: str = ""
    error: str = ""
    tail: deque = field(default_factory=lambda: deque(maxlen=40))
    layers: dict[str, dict[str, Any]] = field(default_factory=dict)

    def feed(self, event: dict[str, Any]) -> None:
        if "error" in event:
            self.error = str(event.get("errorDetail", {}).get("message") or event["error"]).strip()
            return
        if "stream" in event:
            for line in str(event["stream"]).splitlines():
                line = line.rstrip()
                if not line:
                    continue
                self.tail.append(line)
                m = _STEP.match(line)
                if m:
                    self.step, self.steps, self.step_text = int(m[1]), int(m[2]), m[3]
                elif line.startswith("Successfully built "):
                    self.image_id = line.split()[-1]
        if "aux" in event and isinstance(event["aux"], dict) and "ID" in event["aux"]:
            self.image_id = event["aux"]["ID"]
        if "status" in event and event.get("id"):
            layer = self.layers.setdefault(event["id"], {"status": "", "current": 0, "total": 0})
            layer["status"] = event["status"]
            detail = event.get("progressDetail") or {}
            if detail.get("total"):
                layer["current"], layer["total"] = detail.get("current", 0), detail["total"]
            elif event["status"] in ("Download complete", "Pull complete", "Already exists"):
                layer["current"] = layer["total"] = layer["total"] or 1


class StreamProgress:
    """Draws a StreamState: one bar for build steps, one per layer being pulled."""

    def __init__(self, title: str, console=None, log: IO[str] | None = None):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

        self.console = console or Console(stderr=True)
        self.log = log
        self.state = StreamState()
        self.title = title
        self._progress = Progress(
            TextColumn("{task.description}", markup=False), BarColumn(), TaskProgressColumn(),
            TimeElapsedColumn(), console=self.console, transient=False)
        self._steps_task = None
        self._layer_tasks: dict[str, Any] = {}

    def __enter__(self) -> "StreamProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    def feed(self, event: dict[str, Any]) -> None:
        self.state.feed(event)
        if self.log is not None:
            text = event.get("stream") or event.get("error") or ""
            if not text and event.get("status") and not event.get("progressDetail"):
                text = f"{event.get('id', '')} {event['status']}".strip() + "\n"
            if text:
                self.log.write(text if text.endswith("\n") else text + "\n")
        self._draw(event)

    def _draw(self, event: dict[str, Any]) -> None:
        s = self.state
        if s.steps:
            desc = f"{self.title} step {s.step}/{s.steps}: {_shorten(s.step_text, 60)}"
            if self._steps_task is None:
                self._steps_task = self._progress.add_task(desc, total=s.steps)
            self._progress.update(self._steps_task, description=desc, total=s.steps,
                                  completed=max(s.step - 1, 0))
        layer_id = event.get("id")
        if layer_id and layer_id in s.layers:
            layer = s.layers[layer_id]
            desc = f"  {layer_id[:12]} {layer['status'].lower()}"
            if layer_id not in self._layer_tasks:
                self._layer_tasks[layer_id] = self._progress.add_task(desc, total=layer["total"] or None)
            self._progress.update(self._layer_tasks[layer_id], description=desc,
                                  total=layer["total"] or None, completed=layer["current"])

    def finish(self) -> None:
        if self._steps_task is not None:
            self._progress.update(self._steps_task, completed=self.state.steps,
                                  description=f"{self.title}: done")


def _shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


# --- engine operations ---------------------------------------------------------------------

def client_from_env(timeout: int = 3600):
    """A docker SDK client; long timeout because a build step can be silent for minutes."""
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except DockerException as exc:
        raise ImageError(f"cannot reach the Docker engine ({exc}); start it "
                         "(tools/docker/start-dockerd.sh) or set DOCKER_HOST") from None
    return client


def image_exists(client, ref: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        client.images.get(ref)
        return True
    except ImageNotFound:
        return False


def build(platform: str, arch: str | None = None, *, tag: str | None = None,
          base_image: str | None = None, wheelhouse: Path | str | None = None,
          root: Path | None = None, client=None, console=None, log_path: Path | None = None,
          nocache: bool = False, extra_args: dict[str, str] | None = None) -> str:
    """Build the platform's image and return its tag. Raises ImageError with the build's tail."""
    arch = arch or default_arch(platform)
    tag = tag or image_tag(platform, arch)
    root = Path(root or repo_root())
    dockerfile = dockerfile_for(platform)
    if not (root / dockerfile).is_file():
        raise ImageError(f"{root / dockerfile} not found")
    client = client or client_from_env()
    args = build_args(platform, arch, base_image)
    args.update(extra_args or {})
    context = build_context(root, dockerfile, Path(wheelhouse) if wheelhouse else None)
    size = context.seek(0, io.SEEK_END)
    context.seek(0)
    if console is not None:
        console.print(f"sending the build context: {size / 1e6:.0f} MB", markup=False)
    log = open(log_path, "a", buffering=1) if log_path else None  # line-buffered: tail -f works
    try:
        with context, StreamProgress(f"build {tag}", console=console, log=log) as progress:
            stream = client.api.build(
                fileobj=context, custom_context=True, dockerfile=dockerfile, tag=tag,
                buildargs=args, rm=True, forcerm=True, pull=False, nocache=nocache,
                decode=True, labels={f"{LABEL_PREFIX}built-by": "radiance build"})
            _drain(stream, progress)
            progress.finish()
    finally:
        if log is not None:
            log.close()
    return tag


def pull(ref: str, *, client=None, console=None) -> str:
    client = client or client_from_env()
    repository, tag = _split_ref(ref)
    with StreamProgress(f"pull {ref}", console=console) as progress:
        _drain(client.api.pull(repository, tag=tag, stream=True, decode=True), progress)
    return ref


_pull = pull  # build_command's `pull` flag shadows the function


def ensure(platform: str, arch: str | None = None, *, image: str | None = None, pull_image: bool = False,
           rebuild: bool = False, **build_kwargs) -> str:
    """The image a profile needs: present → used; else pulled (pull_image) or built."""
    ref = image or image_tag(platform, arch)
    client = build_kwargs.pop("client", None) or client_from_env()
    if not rebuild and image_exists(client, ref):
        return ref
    if pull_image:
        return pull(ref, client=client, console=build_kwargs.get("console"))
    return build(platform, arch, tag=ref, client=client, **build_kwargs)


# The archs `python -m radiance.kernels.aot` compiles for, per GPU platform (a test keeps the table equal
# to radiance.kernels.aot.ARCHS; the launcher does not import the plugin).
GPU_TARGETS = {p.name: p.aot_targets for p in platforms.PLATFORMS.values() if p.gpu}


def check_arch(platform: str, arch: str) -> None:
    """GPU images compile radiance's kernels for arch at build time: it must be a known target."""
    if not platforms.is_gpu(platform):
        return
    known = GPU_TARGETS[platform]
    if arch not in known:
        raise UsageError(f"--arch {arch!r} is not a {platform} target radiance compiles for — "
                         f"fix: one of {', '.join(known)}")


def resolve(profile, platform: str | None = None, arch: str | None = None) -> tuple[str, str, str]:
    """(platform, arch, image ref) for a profile: explicit values, then the profile, then the probe."""
    platform = platform or profile.runtime.platform
    probe_gpu = platforms.is_gpu(platform) and arch is None
    if platform == platforms.AUTO or probe_gpu:
        from . import hardware

        hw = hardware.probe_all()
        if platform == platforms.AUTO:
            platform = hw.platform
        if arch is None and platforms.is_gpu(platform):
            vendor = platforms.get(platform).probe
            found = [g.arch for g in hw.gpus if g.vendor == vendor and g.arch and g.arch != "unknown"]
            arch = found[0] if found else None
    arch = arch or default_arch(platform)
    check_arch(platform, arch)
    ref = profile.runtime.image or image_tag(platform, arch)
    return platform, arch, ref


def build_command(profile, *, platform: str | None = None, pull: bool = False,
                  wheelhouse: str | None = None, base_image: str | None = None,
                  arch: str | None = None, console=None) -> str:
    """`radiance build PROFILE`: build (or pull) the image the profile needs; prints the tag."""
    from . import console as cli_console

    platform, arch, ref = resolve(profile, platform, arch)
    err = console or cli_console.err
    if pull:
        _pull(ref, console=err)
    else:
        err.print(f"building {ref} from {dockerfile_for(platform)}"
                  + (f" with the wheelhouse {wheelhouse}" if wheelhouse else ""), markup=False)
        build(platform, arch, tag=ref, base_image=base_image,
              wheelhouse=Path(wheelhouse) if wheelhouse else None, console=err)
    cli_console.out.print(ref, markup=False)
    return ref


def labels_of(client, ref: str) -> dict[str, str]:
    return dict(client.images.get(ref).labels or {})


def _drain(stream: Iterable[dict[str, Any]], progress: StreamProgress) -> None:
    from docker.errors import APIError

    try:
        for event in stream:
            progress.feed(event)
            if progress.state.error:
                break
    except APIError as exc:
        raise ImageError(str(exc.explanation or exc)) from None
    if progress.state.error:
        tail = "\n".join(list(progress.state.tail)[-20:])
        raise ImageError(f"{progress.title} failed: {progress.state.error}\n{tail}".rstrip())


def _split_ref(ref: str) -> tuple[str, str]:
    # A colon after the last slash separates the tag; one before it belongs to a registry port.
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:
        return ref, "latest"
    return name, tag


def iter_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Split a docker log byte stream into text lines (shared with the docker runtime)."""
    pending = ""
    for chunk in chunks:
        pending += chunk.decode("utf-8", errors="replace")
        *lines, pending = pending.split("\n")
        for line in lines:
            yield line
    if pending:
        yield pending


__all__ = [
    "ImageError", "PLATFORMS", "REPOSITORY", "build", "build_args", "build_command", "build_context",
    "check_arch", "client_from_env", "context_files", "default_arch", "dockerfile_for", "ensure",
    "image_exists", "image_tag", "labels_of", "pull", "repo_root", "resolve",
]
