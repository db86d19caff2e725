"""radiance/features.py: the one feature table, and the static rules `radiance check` explains with."""
from __future__ import annotations

import json

import pytest

from radiance import envs, features
from radiance.features import ModelFacts, Setup, applicability

TINY_QWEN35 = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "mtp_num_hidden_layers": 1,
               "tie_word_embeddings": False}
QWEN3NEXT_INT4 = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "num_experts": 512,
                  "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
                  "quantization_config": {"quant_method": "auto-round", "bits": 4}}
QWEN35_FP8_VL = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
                 "text_config": {"model_type": "qwen3_5_text", "mtp_num_hidden_layers": 1,
                                 "tie_word_embeddings": False},
                 "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128],
                                         "modules_to_not_convert": ["lm_head", "model.visual.blocks.0"]}}


def test_every_feature_has_a_declared_knob_and_a_patch_module():
    assert features.NAMES == ("dynamic_draft", "w4_drafter", "int4_head", "fp8_stream")
    for f in features.FEATURES:
        assert f.knob in envs.KNOBS and f.side in ("draft", "target")
        # a feature without kernels (dynamic-draft: host-side policy) says so with an empty tag
        assert f.module.startswith("radiance.") and (f.kernels or f.name == "dynamic_draft")
    assert envs.get("RADIANCE_DRAFT_TAU", {}) == features.DRAFT_TAU
    assert envs.get("RADIANCE_W4_GROUP_SIZE", {}) == features.W4_GROUP_SIZE


def test_the_seeds_deployment_applies_everything():
    facts = ModelFacts.from_config(QWEN35_FP8_VL)
    setup = Setup(tp=2, drafter="mtp", quantization="radiance_fp8")
    for name in features.NAMES:
        applies, why = applicability(name, facts, setup)
        assert applies is True, (name, why)
    assert "128x128 fp8 weights" in applicability("fp8_stream", facts, setup)[1]
    # the fused two-rank all-reduce epilogue has not run on two GPUs yet: check says so at TP=2 only
    assert "fused two-rank all-reduce epilogue (GPUs, RADIANCE_FP8_STREAM_FUSED_AR) is unverified on this " \
           "hardware" in applicability("fp8_stream", facts, setup)[1]
    assert "unverified" not in applicability("fp8_stream", facts, Setup(tp=4, drafter="mtp",
                                                                        quantization="radiance_fp8"))[1]


def test_the_80b_int4_applies_what_it_can_and_says_why_not():
    facts = ModelFacts.from_config(QWEN3NEXT_INT4)
    setup = Setup(tp=2, drafter="mtp")
    assert applicability("dynamic_draft", facts, setup)[0] is True
    assert applicability("int4_head", facts, setup)[0] is True
    ok, why = applicability("fp8_stream", facts, Setup(tp=2, drafter="mtp", quantization="radiance_fp8"))
    assert ok is False and "sparse-MoE" in why
    ok, why = applicability("w4_drafter", facts, setup)
    assert ok is True and "routed experts are FusedMoE" in why


@pytest.mark.parametrize("cfg,setup,feature,needle", [
    (TINY_QWEN35, Setup(tp=1, drafter="mtp", quantization="radiance_fp8"), "fp8_stream", "parallel.tp > 1"),
    (TINY_QWEN35, Setup(tp=2, drafter="mtp"), "fp8_stream", "model.quantization: radiance_fp8"),
    (dict(TINY_QWEN35, tie_word_embeddings=True), Setup(tp=2, drafter="mtp"), "int4_head", "tied"),
    (dict(TINY_QWEN35, quantization_config={"quant_method": "gptq", "lm_head": True}), Setup(tp=2, drafter="mtp"),
     "int4_head", "quantises lm_head itself"),
    (TINY_QWEN35, Setup(tp=2, drafter="dflash"), "dynamic_draft", "controls MTP drafting"),
    (dict(TINY_QWEN35, mtp_num_hidden_layers=0), Setup(tp=2, drafter="mtp"), "w4_drafter", "no MTP layer"),
])
def test_declines_name_their_reason(cfg, setup, feature, needle):
    applies, why = applicability(feature, ModelFacts.from_config(cfg), setup)
    assert applies is False and needle in why


@pytest.mark.parametrize("platform,vllm_args,drafter,expected", [
    ("cpu", {}, "mtp", False),                                  # vLLM's CPU platform turns it off
    ("rocm", {}, "mtp", True),                                  # its GPU default with MTP
    ("cuda", {"async-scheduling": False}, "mtp", False),
    ("rocm", {"no-async-scheduling": True}, "mtp", False),
    ("rocm", {}, "ngram", False),
    ("auto", {}, "mtp", None),                                  # not known before the probe
])
def test_check_knows_when_vllm_schedules_asynchronously(platform, vllm_args, drafter, expected):
    from launcher.preflight import async_scheduling

    profile = type("P", (), {"vllm_args": vllm_args, "drafter": type("D", (), {"type": drafter})()})()
    assert async_scheduling(profile, platform) is expected
    facts = ModelFacts.from_config(TINY_QWEN35)
    applies, why = applicability("dynamic_draft", facts, Setup(tp=2, drafter="mtp", async_scheduling=expected))
    # the depth is chosen on the host before the step: it serves under either scheduling, and says which
    assert applies is True, why
    assert {True: "asynchronous scheduling", False: "synchronous scheduling", None: "either scheduling"}[expected] \
        in why


def test_only_the_architecture_known_gives_unknown_where_config_json_is_needed():
    facts = ModelFacts.from_architecture("Qwen3_5ForConditionalGeneration")
    assert facts.moe is False and facts.source == "profile"
    assert applicability("int4_head", facts, Setup(tp=2, drafter="mtp"))[0] is None
    assert applicability("fp8_stream", facts, Setup(tp=2, drafter="mtp", quantization="radiance_fp8"))[0] is True
    assert ModelFacts.from_architecture("LlamaForCausalLM").notes


def test_check_json_explains_all_four_features_of_every_shipped_profile(repo_root, tmp_path):
    """`radiance check --json` before any image exists: a verdict and a reason for each feature."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, RADIANCE_CACHE_DIR=str(repo_root / ".cache" / "radiance"), RADIANCE_HOME=str(tmp_path))
    for profile in sorted((repo_root / "profiles").glob("*.yaml")):
        proc = subprocess.run([sys.executable, "-m", "launcher", "check", str(profile), "--json"], cwd=repo_root,
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode in (0, 4), (profile.name, proc.stderr[-2000:])
        report = json.loads(proc.stdout)
        verdicts = {v["feature"]: v for v in report["features"]}
        assert list(verdicts) == list(features.NAMES), profile.name
        for v in verdicts.values():
            assert v["verdict"] in ("on", "off", "declines", "kernels fail", "unknown") and v["reason"], v
            assert v["kernels"], v  # per target arch (or the CPU reference)
        requested = {n for n, v in verdicts.items() if v["requested"]}
        for name in requested:  # what a shipped profile asks for must not be known to decline
            assert verdicts[name]["verdict"] in ("on", "unknown"), (profile.name, verdicts[name])
