"""Profile validation: every shipped profile loads; every bad one gives one line FILE:LINE: FIELD: ... — fix."""
import re
from pathlib import Path

import pytest

from launcher.profile import Drafter, ProfileError, load_profile, parse_profile
from radiance.features import DRAFT_TAU

REPO = Path(__file__).resolve().parents[2]
GOOD = """\
name: t
model:
  path: builtin:tiny-qwen3next
drafter:
  type: mtp
features:
  dynamic_draft: true
parallel:
  tp: 1
"""
# What a profile with a target-side feature (int4-head, fp8-stream) adds: greedy agreement checked.
CHECKED = "gate:\n  target:\n    min_prefix_agreement: 0.2\n"


@pytest.mark.parametrize("path", sorted((REPO / "profiles").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_profiles_validate(path):
    prof = load_profile(path)
    assert prof.name == path.stem


def test_bool_shorthand_and_defaults():
    prof = parse_profile(GOOD, "x.yaml")
    assert prof.features.dynamic_draft.enabled and prof.features.dynamic_draft.tau == DRAFT_TAU
    assert prof.server.host == "127.0.0.1"
    assert prof.features.enabled_names() == ["dynamic_draft"]


def _error(text: str) -> str:
    with pytest.raises(ProfileError) as exc:
        parse_profile(text, "bad.yaml")
    assert len(exc.value.lines) == 1, exc.value.lines
    line = exc.value.lines[0]
    assert "\n" not in line and "Traceback" not in line
    return line


@pytest.mark.parametrize("text,where,field,needle", [
    (GOOD + "colour: blue\n", "bad.yaml:10", "colour", "unknown key"),
    (GOOD.replace("  tp: 1", "  tp: 0"), "bad.yaml:9", "parallel.tp", ">= 1"),
    (GOOD.replace("  tp: 1", "  tp: two"), "bad.yaml:9", "parallel.tp", "whole number"),
    (GOOD.replace("type: mtp", "type: ngram"), "bad.yaml:7", "features.dynamic_draft", "needs an mtp drafter"),
    (GOOD.replace("type: mtp", "type: eagle"), "bad.yaml:5", "drafter.type", "mtp"),
    (GOOD + "server:\n  api_key: sk-123\n", "bad.yaml:11", "server.api_key", "unknown key"),
    (GOOD + "server:\n  api_key_env: 'sk-123'\n", "bad.yaml:11", "server.api_key_env", "never the key"),
    (GOOD + "env:\n  HF_TOKEN: abc\n", "bad.yaml:10", "env", "secret"),
])
def test_bad_profiles_one_line_with_location_field_and_fix(text, where, field, needle):
    line = _error(text)
    assert line.startswith(where + ":"), line
    assert f" {field}:" in line or f" {field}." in line, line
    assert needle in line, line
    assert "fix:" in line, line


def test_fp8_stream_needs_tp_above_one():
    text = GOOD.replace("  dynamic_draft: true", "  dynamic_draft: true\n  fp8_stream: true")
    line = _error(text)
    assert re.match(r"bad\.yaml:\d+: features\.fp8_stream: needs parallel\.tp > 1", line), line


def test_w4_drafter_needs_linears():
    text = GOOD.replace("type: mtp", "type: none").replace("dynamic_draft: true", "w4_drafter: true")
    assert "features.w4_drafter: needs a drafter with linears" in _error(text)


def test_int4_head_excludes_fp8_head():
    text = GOOD.replace("  path: builtin:tiny-qwen3next", "  path: builtin:tiny-qwen3next\n  fp8_lm_head: true") \
        .replace("dynamic_draft: true", "int4_head: true")
    assert "features.int4_head: excludes an fp8 lm_head" in _error(text)


def test_bad_yaml_names_line():
    line = _error("name: t\nmodel:\n  path: [unclosed\n")
    assert re.match(r"bad\.yaml:\d+: \(yaml\): ", line) and "fix:" in line


@pytest.mark.parametrize("text", ["", "- a\n- b\n"])
def test_empty_or_not_a_mapping(text):
    assert _error(text).startswith("bad.yaml:1: (top level):")


def test_missing_file():
    with pytest.raises(ProfileError) as exc:
        load_profile("/nonexistent/p.yaml")
    assert "file not found" in exc.value.lines[0]


def test_fingerprint_is_stable_and_sensitive():
    a = parse_profile(GOOD, "x")
    b = parse_profile(GOOD, "y")
    c = parse_profile(GOOD.replace("tp: 1", "tp: 2"), "z")
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()


def test_radiance_fp8_quantization_reaches_the_engine(tmp_path):
    from launcher import engine_args

    text = GOOD.replace("  path: builtin:tiny-qwen3next", "  path: builtin:tiny-qwen3next\n  quantization: radiance_fp8") \
        .replace("  tp: 1", "  tp: 2").replace("  dynamic_draft: true", "  dynamic_draft: true\n  fp8_stream: true")
    prof = parse_profile(text + CHECKED, "x.yaml")
    cfg = engine_args.build(prof, platform="cpu", host="127.0.0.1", port=8000, model_arg="/m",
                            model_dir=None, environ={})
    args = cfg.server_args
    assert args[args.index("--quantization") + 1] == "radiance_fp8"
    assert cfg.env["RADIANCE_FP8_STREAM"] == "1" and cfg.env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert "model.quantization" in _error(text.replace("radiance_fp8", "int3"))


def test_gdn_norm_quant_rides_on_fp8_stream(tmp_path):
    from launcher import engine_args

    base = GOOD.replace("  tp: 1", "  tp: 2") + CHECKED
    on = parse_profile(base.replace("  dynamic_draft: true", "  dynamic_draft: true\n  fp8_stream:\n"
                                    "    enabled: true\n    gdn_norm_quant: true"), "x.yaml")
    cfg = engine_args.build(on, platform="cpu", host="127.0.0.1", port=8000, model_arg="/m",
                            model_dir=None, environ={})
    assert cfg.env["RADIANCE_GDN_NORM_QUANT"] == "1"
    line = _error(base.replace("  dynamic_draft: true", "  dynamic_draft: true\n  fp8_stream:\n"
                               "    gdn_norm_quant: true"))
    assert "features.fp8_stream" in line and "gdn_norm_quant" in line and "fix:" in line, line


def test_engine_listens_on_its_socket_with_the_key_kept_out_of_argv():
    from launcher import engine_args

    prof = parse_profile(GOOD, "x.yaml")
    cfg = engine_args.build(prof, platform="cpu", uds="/run/r/engine.sock", engine_key="k-123", model_arg="/m",
                            model_dir=None, environ={"HF_TOKEN": "hf_x"})
    args = cfg.server_args
    assert args[args.index("--uds") + 1] == "/run/r/engine.sock"
    assert "--host" not in args and "--port" not in args and "k-123" not in " ".join(args)
    assert cfg.secret_env == {"HF_TOKEN": "hf_x", "VLLM_API_KEY": "k-123"}
    # vLLM's internal sockets on loopback, not on whatever address get_ip() finds
    assert (cfg.env["VLLM_HOST_IP"], cfg.env["GLOO_SOCKET_IFNAME"], cfg.env["NCCL_SOCKET_IFNAME"]) == \
        ("127.0.0.1", "lo", "lo")


def test_launcher_owned_vllm_flags_are_refused():
    for flag in ("uds", "api-key", "host", "port"):
        line = _error(GOOD + f"vllm_args:\n  {flag}: x\n")
        assert "vllm_args" in line and flag in line and "fix:" in line, line


def test_gpu_engines_share_one_triton_cache_across_feature_sets():
    """vLLM puts Triton's cache inside each compile key's directory unless the engine is given one; every
    feature set is its own key, so each would re-JIT and re-autotune the GDN kernels. On a GPU the engine
    gets Triton's default directory by name; a user's own wins; the CPU engine is left as it was."""
    from launcher import engine_args

    prof = parse_profile(GOOD, "x.yaml")

    def env(platform, environ):
        return engine_args.build(prof, platform=platform, model_arg="/m", model_dir=None, environ=environ).env

    assert env("cuda", {"TRITON_HOME": "/h"})["TRITON_CACHE_DIR"] == "/h/.triton/cache"
    assert env("rocm", {"TRITON_HOME": "/h"})["TRITON_CACHE_DIR"] == "/h/.triton/cache"
    assert "TRITON_CACHE_DIR" not in env("cuda", {"TRITON_CACHE_DIR": "/mine"})  # the user's, inherited as is
    assert "TRITON_CACHE_DIR" not in env("cpu", {"TRITON_HOME": "/h"})
    with_own = parse_profile(GOOD.replace("name: ", "env:\n  TRITON_CACHE_DIR: /p\nname: ", 1), "x.yaml")
    assert engine_args.build(with_own, platform="cuda", model_arg="/m", model_dir=None,
                             environ={}).env["TRITON_CACHE_DIR"] == "/p"


def test_gpu_engines_keep_vllms_runner_and_dynamic_draft_gets_a_graph_for_every_depth():
    """On a GPU every feature serves on vLLM's default runner (V2): the launcher sets no runner, and with
    dynamic-draft and an MTP drafter it names every draft depth 1..k in vLLM's per-batch-size schedule so that
    V2 captures full graphs for each (the patch chooses among them). Not on a CPU (V1), nor where the
    profile's env or the launcher's forces V1, nor without dynamic-draft."""
    import json

    from launcher import engine_args

    def built(text, platform="cuda", environ=None):
        cfg = engine_args.build(parse_profile(text, "x.yaml"), platform=platform, model_arg="/m", model_dir=None,
                                environ=environ or {})
        spec = json.loads(cfg.server_args[cfg.server_args.index("--speculative-config") + 1])
        return cfg.env.get("VLLM_USE_V2_MODEL_RUNNER"), spec.get("num_speculative_tokens_per_batch_size")

    k4 = GOOD.replace("  type: mtp", "  type: mtp\n  num_speculative_tokens: 4")
    tiers = [[1, 1, 1], [2, 2, 2], [3, 3, 3], [4, 4, 4]]
    assert built(k4) == (None, tiers) and built(k4, "rocm") == (None, tiers)
    assert built(k4, "cpu") == (None, None)
    assert built(k4 + "env:\n  VLLM_USE_V2_MODEL_RUNNER: '0'\n") == ("0", None)
    assert built(k4, environ={"VLLM_USE_V2_MODEL_RUNNER": "0"}) == (None, None)
    assert built(k4.replace("  dynamic_draft: true", "  dynamic_draft: false\n  w4_drafter: true\n  int4_head: true")
                 + CHECKED) == (None, None)
    assert built(GOOD.replace("  type: mtp", "  type: mtp\n  num_speculative_tokens: 1"))[1] is None


def test_check_states_the_runner_and_warns_when_a_profile_forces_the_runner_the_features_lost_on():
    from launcher.preflight import runner_finding

    k4 = GOOD.replace("  type: mtp", "  type: mtp\n  num_speculative_tokens: 4")
    status, detail = runner_finding(parse_profile(k4, "x.yaml"))
    assert status == "ok" and detail.startswith("vLLM's default (Model Runner V2 on GPUs); dynamic-draft: full CUDA "
                                                "graphs captured for each draft depth 1..4")
    status, detail = runner_finding(parse_profile(k4 + "env:\n  VLLM_USE_V2_MODEL_RUNNER: '0'\n", "x.yaml"))
    assert status == "warn" and "verifies the configured depth" in detail and "fix: remove it" in detail
    no_dd = GOOD.replace("  dynamic_draft: true", "  dynamic_draft: false\n  w4_drafter: true\n  int4_head: true")
    assert runner_finding(parse_profile(no_dd + CHECKED, "x.yaml")) == \
        ("ok", "vLLM's default (Model Runner V2 on GPUs)")
    status, detail = runner_finding(parse_profile(no_dd + CHECKED + "env:\n  VLLM_USE_V2_MODEL_RUNNER: '0'\n",
                                                  "x.yaml"))
    assert status == "warn" and "lost to stock V2" in detail and "fix: remove it" in detail
    plain = GOOD.replace("  dynamic_draft: true", "  dynamic_draft: false\n  w4_drafter: false\n  int4_head: false")
    assert runner_finding(parse_profile(plain, "x.yaml")) == ("ok", "vLLM's default (Model Runner V2 on GPUs)")
    assert runner_finding(parse_profile(plain + "env:\n  VLLM_USE_V2_MODEL_RUNNER: '0'\n", "x.yaml")) == \
        ("ok", "VLLM_USE_V2_MODEL_RUNNER=0 (profile env)")


def test_a_target_side_feature_needs_greedy_agreement_checked():
    """int4-head and fp8-stream change the target's numerics: with the target check on, its greedy prefix
    agreement must be a threshold (issue 38); draft-side features and a target check that is off need none."""
    int4 = GOOD.replace("  dynamic_draft: true", "  dynamic_draft: true\n  int4_head: true")
    line = _error(int4)
    assert "gate.target" in line and "int4_head" in line and "fix: set gate.target.min_prefix_agreement" in line
    assert parse_profile(int4 + CHECKED, "x.yaml").gate.target.min_prefix_agreement == 0.2
    assert not parse_profile(int4 + "gate:\n  target:\n    enabled: false\n", "x.yaml").gate.target.enabled
    assert parse_profile(GOOD, "x.yaml").gate.target.min_prefix_agreement is None
