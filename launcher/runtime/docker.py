"""Runtime "docker": the engine in a container, driven through the docker SDK (never the docker CLI).

The container runs ``python -m vllm.entrypoints.openai.api_server`` with the spec's arguments;
the gateway and the gate stay on the host. What crosses the boundary:

- no port: the engine serves on a Unix socket (vLLM's --uds) in the deployment's private socket
  directory (launcher.engine_link), bind-mounted at ``/var/cache/radiance/run``; the container
  gets the launcher's group and a umask of 007, so the launcher's user, and nobody else on the
  host, can connect (the directory is setgid, mode 2770);
- the model directories (read-only: the target, a local drafter), each mounted at its host path so
  that the arguments mean the same inside and out (the engine reports through its own /metrics,
  nothing is written back to the host);
- caches as named volumes: HF and vLLM shared by every deployment, Triton per image (its
  ahead-of-time kernels are seeded from the image into a fresh volume, so a newer image must
  not inherit an older image's volume);
- the GPUs: AMD through /dev/kfd + /dev/dri with the groups owning them, NVIDIA through a
  device request.

Containers carry the label ``radiance.deployment=<name>`` so they can be found again from a new
launcher process (``radiance status``/``down`` after the one that started them is gone).
"""
from __future__ import annotations

import grp
import os
import re
import stat
import threading
from pathlib import Path
from typing import Any, Iterator

from .. import console, platforms
from ..engine_args import ENGINE_MODULE
from ..engine_link import SOCKET_NAME
from ..errors import LauncherError
from .base import Deployment, EngineHandle, EngineSpec, follow_file
from .local import HostRuntime

LABEL_DEPLOYMENT = "radiance.deployment"
LABEL_ROLE = "radiance.role"

# Where the images keep their caches (images/Dockerfile.*); the volumes mount there.
CACHE_ROOT = "/var/cache/radiance"
HF_VOLUME = "radiance-hf-cache"
VLLM_VOLUME = "radiance-vllm-cache"
RUN_DIR = f"{CACHE_ROOT}/run"        # the socket directory, inside the container
AMD_DEVICES = ("/dev/kfd", "/dev/dri")
_NAME_SAFE = re.compile(r"[^a-zA-Z0-9_.-]")


class DockerRuntimeError(LauncherError):
    """The engine container could not be created or started."""


def container_name(deployment: str) -> str:
    return f"radiance-{_NAME_SAFE.sub('-', deployment)}-engine"


def triton_volume(image: str) -> str:
    return "radiance-triton-" + _NAME_SAFE.sub("-", image.replace(":", "-").replace("/", "-"))[:180]


def engine_command(server_args: list[str]) -> list[str]:
    """The argv inside the container: the socket moves to its in-container path, and the umask lets
    the launcher's group (given to the container) connect to it."""
    args = list(server_args)
    for i, arg in enumerate(args):
        if arg == "--uds" and i + 1 < len(args):
            args[i + 1] = f"{RUN_DIR}/{SOCKET_NAME}"
        elif arg.startswith("--uds="):
            args[i] = f"--uds={RUN_DIR}/{SOCKET_NAME}"
    if not any(a == "--uds" or a.startswith("--uds=") for a in args):
        args += ["--uds", f"{RUN_DIR}/{SOCKET_NAME}"]
    return ["sh", "-c", 'umask 0007 && exec "$@"', "radiance-engine", "python", "-m", ENGINE_MODULE, *args]


def _device_gids(paths: tuple[str, ...]) -> list[str]:
    """Numeric gids that own the GPU device nodes (names like 'render' may not exist in the image)."""
    gids: set[int] = set()
    for name in ("video", "render"):
        try:
            gids.add(grp.getgrnam(name).gr_gid)
        except KeyError:
            pass
    for root in paths:
        p = Path(root)
        nodes = [p] + (sorted(p.iterdir()) if p.is_dir() else [])
        for node in nodes:
            try:
                st = node.stat()
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode) and st.st_gid != 0:
                gids.add(st.st_gid)
    return [str(g) for g in sorted(gids)]


def _nofile_limit(wanted: int = 65536) -> int:
    """vLLM wants many open files; a container may not exceed the daemon's own hard limit, which
    on hosts that cap it (here: dockerd inherits the launcher's) is best approximated by ours."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def platform_options(platform: str) -> dict[str, Any]:
    """containers.run() options that give the engine its accelerator (by who makes it: the probe's vendor)."""
    # vLLM's workers share tensors through /dev/shm; the default 64 MB is far too small.
    opts: dict[str, Any] = {"ipc_mode": "host"}
    try:
        plat = platforms.get(platform)
    except ValueError as exc:
        raise DockerRuntimeError(str(exc)) from None
    if plat.probe == "amd":
        missing = [d for d in AMD_DEVICES if not os.path.exists(d)]
        if missing:
            raise DockerRuntimeError(f"{', '.join(missing)} not found: the {plat.name} engine needs the "
                                     "amdgpu driver's device nodes on this host")
        opts.update(
            devices=[f"{d}:{d}:rwm" for d in AMD_DEVICES],
            group_add=_device_gids(AMD_DEVICES),
            security_opt=["seccomp=unconfined"],
        )
    elif plat.probe == "nvidia":
        from docker.types import DeviceRequest

        opts["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return opts


def container_config(spec: EngineSpec, image: str) -> dict[str, Any]:
    """Everything containers.run() gets, except the secrets (merged in at start, never returned)."""
    from docker.types import Ulimit

    env = dict(spec.env)
    env.update({
        "HF_HOME": f"{CACHE_ROOT}/hf",
        "VLLM_CACHE_ROOT": f"{CACHE_ROOT}/vllm",
        "TRITON_CACHE_DIR": f"{CACHE_ROOT}/triton",
        "RADIANCE_ENGINE_UDS": f"{RUN_DIR}/{SOCKET_NAME}",   # what the image's HEALTHCHECK probes
        "PYTHONUNBUFFERED": "1",
    })
    volumes: dict[str, dict[str, str]] = {
        HF_VOLUME: {"bind": f"{CACHE_ROOT}/hf", "mode": "rw"},
        VLLM_VOLUME: {"bind": f"{CACHE_ROOT}/vllm", "mode": "rw"},
        triton_volume(image): {"bind": f"{CACHE_ROOT}/triton", "mode": "rw"},
    }
    for local in (spec.model_dir, *spec.extra_dirs):
        if local is not None:
            volumes[str(local)] = {"bind": str(local), "mode": "ro"}
    if spec.socket_dir is None:
        raise DockerRuntimeError("the docker runtime needs a socket directory (EngineSpec.socket_dir)")
    volumes[str(spec.socket_dir)] = {"bind": RUN_DIR, "mode": "rw"}
    cfg: dict[str, Any] = dict(
        image=image,
        command=engine_command(spec.server_args),
        name=container_name(spec.deployment),
        detach=True,
        init=True,   # reaps vLLM's engine-core/worker children and forwards SIGTERM to the server
        environment=env,
        volumes=volumes,
        labels={LABEL_DEPLOYMENT: spec.deployment, LABEL_ROLE: "engine"},
        stop_signal="SIGTERM",
        ulimits=[Ulimit(name="nofile", soft=_nofile_limit(), hard=_nofile_limit())],
        log_config={"type": "json-file", "config": {"max-size": "50m", "max-file": "3"}},
    )
    cfg.update(platform_options(spec.platform))
    # The launcher's group, so that the socket (umask 007, setgid directory) is ours to connect to.
    cfg["group_add"] = sorted({*cfg.get("group_add", []), str(os.getgid())})
    return cfg


class DockerEngine:
    name = "docker"

    def __init__(self, client=None):
        self._client = client
        self._mirrors: dict[str, threading.Thread] = {}

    @property
    def client(self):
        if self._client is None:
            from ..images import client_from_env

            self._client = client_from_env(timeout=600)
        return self._client

    # -- Engine protocol --------------------------------------------------------------------
    def start(self, spec: EngineSpec) -> EngineHandle:
        from docker.errors import APIError, ImageNotFound, NotFound

        from .. import images

        image = spec.image or images.image_tag(spec.platform)
        try:
            self.client.images.get(image)
        except ImageNotFound:
            raise DockerRuntimeError(f"image {image} is not present — fix: `radiance build PROFILE` "
                                     "(or --pull), or pass --image") from None
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        name = container_name(spec.deployment)
        try:
            old = self.client.containers.get(name)
            if old.status == "running":
                raise DockerRuntimeError(f"container {name} is already running — fix: "
                                         f"`radiance down {spec.deployment}`")
            old.remove(force=True)
        except NotFound:
            pass
        cfg = container_config(spec, image)
        cfg["environment"] = {**cfg["environment"], **spec.secret_env}
        try:
            container = self.client.containers.run(**cfg)
        except APIError as exc:
            self._discard(name)  # created but not started: leave nothing behind
            # The message may quote the config; keep the secrets out of it.
            raise DockerRuntimeError(f"cannot start {name}: {_redact(str(exc.explanation or exc), spec)}") \
                from None
        handle = EngineHandle(runtime=self.name, ident=container.id, spec=spec)
        self._mirror_logs(handle)
        return handle

    def alive(self, handle: EngineHandle) -> bool:
        container = self._container(handle)
        if container is None:
            return False
        return container.status in ("created", "running", "restarting")

    def stop(self, handle: EngineHandle, timeout: float) -> None:
        """SIGTERM (vLLM finishes in-flight requests), wait up to timeout, SIGKILL, remove."""
        container = self._container(handle)
        if container is None:
            return
        from docker.errors import APIError, NotFound

        try:
            container.stop(timeout=max(int(round(timeout)), 1))
        except NotFound:
            return
        except APIError:
            pass  # already stopping or gone; removal below settles it
        mirror = self._mirrors.pop(handle.ident, None)
        if mirror is not None:
            mirror.join(timeout=5)
        else:
            self._dump_logs(container, handle.spec.log_path)
        try:
            container.remove(force=True)
        except NotFound:
            pass

    def logs(self, handle: EngineHandle, follow: bool = False) -> Iterator[str]:
        container = self._container(handle)
        if container is None:
            # Removed: what the mirror (or the final dump) wrote is all there is.
            yield from follow_file(handle.spec.log_path, False, lambda: False)
            return
        from ..images import iter_lines

        yield from iter_lines(container.logs(stream=True, follow=follow))

    # -- finding containers again -----------------------------------------------------------
    def containers(self, deployment: str | None = None) -> list:
        label = LABEL_DEPLOYMENT if deployment is None else f"{LABEL_DEPLOYMENT}={deployment}"
        return self.client.containers.list(all=True, filters={"label": label})

    def remove_leftovers(self, deployment: str, timeout: float = 30.0) -> int:
        """Stop and remove every container of a deployment; returns how many there were."""
        found = self.containers(deployment)
        for c in found:
            try:
                c.stop(timeout=max(int(round(timeout)), 1))
            finally:
                c.remove(force=True)
        return len(found)

    # -- internals --------------------------------------------------------------------------
    def _discard(self, name: str) -> None:
        from docker.errors import APIError

        try:
            self.client.containers.get(name).remove(force=True)
        except APIError:
            pass

    def _container(self, handle: EngineHandle):
        from docker.errors import NotFound

        try:
            return self.client.containers.get(handle.ident)
        except NotFound:
            return None

    def _mirror_logs(self, handle: EngineHandle) -> None:
        """Copy the container's output into spec.log_path while this process lives.

        The supervisor shows the last log line as loading progress and `radiance logs` reads the
        file after the container is gone; the json-file driver stays the source while it exists.
        """
        container = self.client.containers.get(handle.ident)
        path = handle.spec.log_path

        def run() -> None:
            try:
                with open(path, "ab", buffering=0) as out:
                    for chunk in container.logs(stream=True, follow=True):
                        out.write(chunk)
            except Exception:  # the container went away under us; the log holds what came
                pass

        t = threading.Thread(target=run, name=f"logs-{container.name}", daemon=True)
        t.start()
        self._mirrors[handle.ident] = t

    @staticmethod
    def _dump_logs(container, path: Path) -> None:
        try:
            data = container.logs(stream=False)
        except Exception:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as out:
            out.write(data)


def _redact(text: str, spec: EngineSpec) -> str:
    for value in spec.secret_env.values():
        if value:
            text = text.replace(value, "***")
    return text


class DockerRuntime(HostRuntime):
    kind = "docker"
    hardware = "docker"
    group_access = True     # the container gets the launcher's group and reaches the socket through it

    def __init__(self, image: str | None = None) -> None:
        super().__init__()
        self.given_image = image

    @classmethod
    def from_profile(cls, profile, *, image: str | None = None, **given) -> "DockerRuntime":
        return cls(image)

    def argv(self) -> tuple[str, ...]:
        return ("--image", self.given_image) if self.given_image else ()

    def image(self, dep: Deployment) -> str:
        if self.given_image is not None:
            return self.given_image
        from .. import images

        return images.resolve(dep.profile, dep.platform)[2]

    def new_engine(self) -> DockerEngine:
        return DockerEngine()

    @classmethod
    def leftovers(cls, st) -> int:
        try:
            return DockerEngine().remove_leftovers(st.name)
        except Exception as exc:  # no engine reachable: nothing we can remove
            console.warn(f"{st.name}: could not look for leftover containers: {exc}")
            return 0
