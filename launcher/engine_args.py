"""A validated profile turned into what the engine gets: vLLM server arguments and env.

This is the whole contract between the launcher and the plugin: flags for vLLM, and
``RADIANCE_*`` variables (declared in radiance/envs.py) for the patches. ``from_profile`` is the one
way there, for every engine radiance starts: the supervisor's (local, docker), a Ray replica's, the
container entry point's (images/radiance-engine), the stock reference's and the benchmark's.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from radiance.features import FEATURES, Setup, draft_depth_tiers, setup_refusal

from . import paths, platforms
from .engine_link import KEY_ENV
from . import hardware
from .hardware import arch_defaults
from .profile import BUILTIN_PREFIX, Profile

# Secrets the engine may need (gated hub models); passed through, never logged or reported.
PASSTHROUGH_SECRETS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
ENGINE_MODULE = "vllm.entrypoints.openai.api_server"


@dataclass
class EngineConfig:
    server_args: list[str]
    env: dict[str, str]
    model_dir: Path | None          # local directory when the model is on disk
    secret_env: dict[str, str] = field(default_factory=dict)
    extra_dirs: tuple[Path, ...] = ()   # other local checkpoints the engine reads (a drafter)

    def redacted_command(self) -> str:
        return f"python -m {ENGINE_MODULE} " + " ".join(self.server_args)


def engine_argv(server_args: list[str], python: str = sys.executable) -> list[str]:
    """The command line of vLLM's API server with these arguments."""
    return [python, "-m", ENGINE_MODULE, *server_args]


def process_env(env: dict[str, str], secret_env: dict[str, str],
                base: dict[str, str] | None = None) -> dict[str, str]:
    """The engine process's whole environment: ``base`` (ours by default), the profile's, the secrets."""
    out = dict(os.environ if base is None else base)
    out.update(env)
    out.update(secret_env)
    return out


def from_profile(profile: Profile, *, platform: str, uds: str | None = None, host: str = "127.0.0.1",
                 port: int = 8000, engine_key: str | None = None, cache_dir: Path | None = None,
                 repo_root: Path | None = None, environ: dict[str, str] | None = None,
                 arch: str | None = None) -> EngineConfig:
    """The profile as the engine's command and environment: its model and drafter found (a builtin model
    generated on first use), then ``build``. ``repo_root``: where ``builtin:`` checkpoints live
    (default: this checkout's). ``arch``: the GPU arch the engine runs on (default: ``engine_arch``)."""
    from . import paths

    if arch is None:
        arch = engine_arch(platform, environ)
    cache_dir = paths.cache_home() if cache_dir is None else cache_dir
    repo_root = paths.REPO_ROOT if repo_root is None else repo_root
    model_arg, model_dir = resolve_model(profile, cache_dir, repo_root)
    drafter_arg, drafter_dir = resolve_drafter(profile, cache_dir, repo_root)
    cfg = build(profile, platform=platform, model_arg=model_arg, model_dir=model_dir, host=host, port=port,
                uds=uds, engine_key=engine_key, environ=environ, drafter_arg=drafter_arg, arch=arch)
    cfg.extra_dirs = (drafter_dir,) if drafter_dir else ()
    return cfg


def engine_arch(platform: str, environ: dict[str, str] | None = None,
                report: "hardware.HardwareReport | None" = None) -> str | None:
    """The GPU arch an engine of ``platform`` runs on: the first GPU it will see here (a probe, or
    ``report``; inside a container, the container's), else the arch the platform's image is built for
    (what `radiance check` assumes on a machine without that GPU); None on the CPU."""
    if not platforms.is_gpu(platform):
        return None
    return hardware.engine_arch(platform, environ, report) or platforms.get(platform).default_arch


def arch_settings(profile: Profile, arch: str | None,
                  environ: dict[str, str] | None = None) -> list[arch_defaults.Resolved]:
    """The arch table's defaults (launcher.hardware.arch_defaults) for this profile on ``arch``, each with
    who decides it: the profile's own env or vllm_args line wins, then the launcher's environment."""
    if not arch:
        return []
    environ = os.environ if environ is None else environ
    return arch_defaults.resolve(arch, profile.parallel.tp, profile.env, profile.vllm_args, environ)


def resolve_model(profile: Profile, cache_dir: Path, repo_root: Path) -> tuple[str, Path | None]:
    """(what vLLM's --model gets, the local directory if there is one)."""
    path = profile.model.path
    if path.startswith(BUILTIN_PREFIX):
        name = path[len(BUILTIN_PREFIX):]
        model_dir = repo_root / "models" / name
        if model_dir.is_dir():  # committed under models/ (trained tiny models, the 27B's config alone)
            return str(model_dir), model_dir
        model_dir = paths.tinymodel(repo_root=repo_root).ensure(cache_dir, arch=name)  # random weights, generated once
        return str(model_dir), model_dir
    local = Path(path).expanduser()
    if local.exists():
        return str(local.resolve()), local.resolve()
    return path, None  # a hub id; vLLM resolves it (HF cache)


def resolve_drafter(profile: Profile, cache_dir: Path, repo_root: Path) -> tuple[str | None, Path | None]:
    """(what the speculative config's ``model`` gets, the local directory if there is one)."""
    model = profile.drafter.model
    if model is None:
        return None, None
    if model.startswith(BUILTIN_PREFIX):  # a trained tiny DFlash drafter committed under models/
        out = repo_root / "models" / f"{model[len(BUILTIN_PREFIX):]}-trained"
        return str(out), out
    local = Path(model).expanduser()
    if local.exists():
        return str(local.resolve()), local.resolve()
    return model, None


def speculative_config(profile: Profile, drafter_arg: str | None = None) -> dict | None:
    d = profile.drafter
    if d.type == "none":
        return None
    cfg: dict = {"num_speculative_tokens": d.num_speculative_tokens}
    if d.type == "mtp":
        cfg["method"] = "mtp"
    elif d.type == "dflash":
        cfg["method"] = "dflash"
        cfg["model"] = drafter_arg or d.model
    elif d.type == "ngram":
        cfg["method"] = "ngram"
        if d.prompt_lookup_max is not None:
            cfg["prompt_lookup_max"] = d.prompt_lookup_max
        if d.prompt_lookup_min is not None:
            cfg["prompt_lookup_min"] = d.prompt_lookup_min
    return cfg


def render_vllm_args(vllm_args: dict) -> list[str]:
    """A profile's ``vllm_args`` as flags: true -> --flag, false -> --no-flag, null -> left out."""
    args: list[str] = []
    for key, value in vllm_args.items():
        if value is True:
            args.append(f"--{key}")
        elif value is False:
            args.append(f"--no-{key}")
        elif value is not None:
            args += [f"--{key}", str(value)]
    return args


def radiance_env(profile: Profile) -> dict[str, str]:
    f = profile.features
    env = {"RADIANCE_ENABLE": "1"}
    env.update({feat.knob: "1" if getattr(f, feat.name).enabled else "0" for feat in FEATURES})
    env["RADIANCE_GDN_NORM_QUANT"] = "1" if f.fp8_stream.gdn_norm_quant else "0"
    if f.dynamic_draft.enabled:
        env["RADIANCE_DRAFT_TAU"] = repr(f.dynamic_draft.tau)
        env["RADIANCE_DRAFT_SCHEDULE"] = f.dynamic_draft.schedule
    return env


def model_runner(platform: str, profile_env: dict[str, str], environ: dict[str, str]) -> str:
    """The vLLM model runner an engine gets, "v1" or "v2": V1 on a CPU; on a GPU V2 (vLLM 0.32's pick there,
    and every feature serves on it) unless its environment says VLLM_USE_V2_MODEL_RUNNER=0."""
    if not platforms.is_gpu(platform):
        return "v1"
    own = profile_env.get("VLLM_USE_V2_MODEL_RUNNER", environ.get("VLLM_USE_V2_MODEL_RUNNER"))
    return "v1" if own == "0" else "v2"


def dynamic_draft_tiers(profile: Profile) -> list[list[int]] | None:
    """The per-batch-size schedule under which Model Runner V2 captures full CUDA graphs, target and drafter,
    for every draft depth 1..k (radiance.features.draft_depth_tiers); dynamic-draft replaces the scheduler's
    lookup of it with its own policy. None where dynamic-draft has no MTP depth to choose."""
    d = profile.drafter
    if not profile.features.dynamic_draft.enabled or d.num_speculative_tokens < 2:
        return None
    if setup_refusal("dynamic_draft", Setup(tp=profile.parallel.tp, pp=profile.parallel.pp, drafter=d.type)):
        return None
    return draft_depth_tiers(d.num_speculative_tokens)


def triton_cache_dir(environ: dict[str, str]) -> str:
    """Triton's own default cache, named explicitly. Unless the engine is given one, vLLM points Triton into
    each torch.compile key's directory (``InductorAdaptor.initialize_cache``), and every feature set is a key
    of its own (radiance.compile_key): each new set, and each changed vllm_arg, would JIT and autotune the
    GDN kernels again, ~90 s of an engine start on an H200 (docs/benchmarks.md, fourth session). Triton's
    cache is keyed by kernel source, options and target, so one directory serves them all. The images set
    their own (a volume)."""
    home = environ.get("TRITON_HOME") or str(Path.home())
    return str(Path(home) / ".triton" / "cache")


def build(profile: Profile, *, platform: str, model_arg: str, model_dir: Path | None,
          host: str = "127.0.0.1", port: int = 8000, uds: str | None = None, engine_key: str | None = None,
          environ: dict[str, str] | None = None, drafter_arg: str | None = None,
          arch: str | None = None) -> EngineConfig:
    """``uds``: serve on this Unix socket instead of host:port; ``engine_key``: the deployment's engine
    key (launcher.engine_link), passed as VLLM_API_KEY among the secrets, never as an argument.
    ``arch``: the GPU arch the engine runs on; its defaults (``arch_settings``) are added where the
    profile does not set the same name."""
    environ = os.environ if environ is None else environ
    table_env, table_args = arch_defaults.to_apply(
        arch_settings(profile, arch, environ) if platforms.is_gpu(platform) else [])
    m, p = profile.model, profile.parallel
    listen = ["--uds", uds] if uds else ["--host", host, "--port", str(port)]
    args = ["--model", model_arg, "--served-model-name", profile.served_name(), *listen,
            "--tensor-parallel-size", str(p.tp), "--pipeline-parallel-size", str(p.pp)]
    dtype = m.dtype
    if platform == platforms.CPU.name and dtype == "auto":
        dtype = "bfloat16"  # vLLM's GDN attention on CPU needs bf16
    args += ["--dtype", dtype]
    if m.max_model_len:
        args += ["--max-model-len", str(m.max_model_len)]
    if m.revision:
        args += ["--revision", m.revision]
    if m.quantization:
        args += ["--quantization", m.quantization]
    if m.trust_remote_code:
        args.append("--trust-remote-code")
    spec = speculative_config(profile, drafter_arg)
    tiers = dynamic_draft_tiers(profile)
    if spec is not None and tiers and model_runner(platform, profile.env, environ) == "v2":
        spec["num_speculative_tokens_per_batch_size"] = tiers
    if spec is not None:
        args += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
        if platform == platforms.CPU.name:
            args.append("--no-enable-prefix-caching")  # MTP on CPU requires it off (vLLM 0.32)
    args += render_vllm_args(profile.vllm_args)
    args += render_vllm_args(table_args)

    env = dict(table_env)
    env.update(profile.env)
    env.update(radiance_env(profile))
    if platforms.is_gpu(platform):
        if "TRITON_CACHE_DIR" not in env and "TRITON_CACHE_DIR" not in environ:
            env["TRITON_CACHE_DIR"] = triton_cache_dir(environ)
    # The engine's internal sockets bind to whatever address they find unless told: vLLM's (engine-core
    # ZMQ, torch.distributed store) to get_ip()'s, gloo's (the CPU groups, on every platform) and
    # NCCL/RCCL's bootstrap to the host name's or the first non-loopback interface -- a LAN or container
    # bridge address, reachable from outside. Every profile is one host: loopback only.
    env.setdefault("VLLM_HOST_IP", "127.0.0.1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    if platform == platforms.CPU.name:
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
        if p.tp * p.pp > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in env:
            env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i) for i in range(p.tp * p.pp))
    secrets = {k: environ[k] for k in PASSTHROUGH_SECRETS if environ.get(k)}
    if engine_key:
        secrets[KEY_ENV] = engine_key
    return EngineConfig(server_args=args, env=env, model_dir=model_dir, secret_env=secrets)
