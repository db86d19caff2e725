"""`radiance bench`'s feature sets: the words, the runners, and the profile each engine gets."""
from __future__ import annotations

import pytest

from launcher.bench import plan
from launcher.errors import UsageError
from launcher.profile import load_profile

TINY = load_profile("profiles/tiny-cpu.yaml")       # dynamic_draft, w4_drafter, int4_head on
TP2 = load_profile("profiles/tiny-cpu-tp2.yaml")    # all four


def test_words_name_the_features_on():
    sets = plan.parse("stock,all,no-int4_head,only-w4_drafter,dynamic_draft+int4_head", TINY, "cuda")
    assert [(s.name, s.features, s.plugin) for s in sets] == [
        ("stock", (), False),
        ("all", ("dynamic_draft", "w4_drafter", "int4_head"), True),
        ("no-int4_head", ("dynamic_draft", "w4_drafter"), True),
        ("only-w4_drafter", ("w4_drafter",), True),
        ("dynamic_draft+int4_head", ("dynamic_draft", "int4_head"), True),
    ]
    # without a suffix a set runs where `radiance up` would run it: vLLM's default V2 on a GPU, V1 on a CPU
    assert [s.runner for s in sets] == ["v2"] * 5
    assert [s.runner for s in plan.parse("stock,all,only-int4_head", TINY, "cpu")] == ["v1"] * 3


def test_runner_suffix_and_its_limits():
    assert plan.parse("stock@v2", TINY, "cuda")[0].runner == "v2"
    with pytest.raises(UsageError, match="V2 needs Triton"):
        plan.parse("stock@v2", TINY, "cpu")
    assert plan.parse("all@v1", TINY, "cuda")[0].runner == "v1"
    with pytest.raises(UsageError, match="@v1 or @v2"):
        plan.parse("stock@v3", TINY, "cuda")


@pytest.mark.parametrize("spec, message", [
    ("", "empty"), ("stock,stock", "twice"), ("no-fp8_stream", "not on in this profile"),
    ("only-fast_head", "names no feature")])
def test_bad_sets_are_usage_errors(spec, message):
    with pytest.raises(UsageError, match=message):
        plan.parse(spec, TINY, "cpu")


def test_default_sets():
    assert plan.default_sets(TINY, "cpu") == "stock,all,no-dynamic_draft,no-w4_drafter,no-int4_head"
    assert plan.default_sets(TINY, "cuda").startswith("stock,all,")
    no_dd = plan.with_features(TINY, ("w4_drafter", "int4_head"))
    assert plan.default_sets(no_dd, "cuda") == "stock,all,no-w4_drafter,no-int4_head"
    assert {s.runner for s in plan.parse(plan.default_sets(TINY, "cuda"), TINY, "cuda")} == {"v2"}


def test_with_features_turns_exactly_those_on_and_keeps_settings():
    p = plan.with_features(TP2, ("fp8_stream",))
    assert p.features.enabled_names() == ["fp8_stream"]
    assert p.features.dynamic_draft.tau == TP2.features.dynamic_draft.tau
    off = plan.with_features(TP2, ())
    assert off.features.enabled_names() == [] and not off.features.fp8_stream.gdn_norm_quant


def test_stock_set_runs_vllm_as_released_and_runners_are_forced_on_gpus():
    from launcher.bench.run import engine_env

    stock, draft, v2 = plan.parse("stock@v1,no-int4_head,stock", TINY, "cuda")
    assert engine_env(stock, {"RADIANCE_ENABLE": "1"}, "cuda") == {"RADIANCE_ENABLE": "0",
                                                                  "VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert engine_env(draft, {"RADIANCE_ENABLE": "1"}, "cuda")["RADIANCE_ENABLE"] == "1"
    assert engine_env(v2, {}, "cuda")["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert "VLLM_USE_V2_MODEL_RUNNER" not in engine_env(stock, {}, "cpu")


def test_depth_suffix_sets_the_draft_tokens_and_is_no_stock_reference():
    from launcher.bench import rounds

    sets = plan.parse("stock@v1,stock@v1/k2,all@v1/k3", TINY, "cuda")
    assert [s.depth for s in sets] == [None, 2, 3]
    assert sets[2].runner == "v1" and "dynamic_draft" in sets[2].features
    assert plan.for_set(TINY, sets[1]).drafter.num_speculative_tokens == 2
    assert plan.for_set(TINY, sets[0]).drafter.num_speculative_tokens == TINY.drafter.num_speculative_tokens
    assert not plan.for_set(TINY, sets[1]).features.enabled_names()
    stock = {"plugin": False, "runner": "v1"}
    assert rounds.is_stock(stock) and not rounds.is_stock({**stock, "depth_override": True})
    for bad in ("stock/2", "stock/k0", "stock/kx", "stock/k17"):
        with pytest.raises(UsageError, match="fix: /k1"):
            plan.parse(bad, TINY, "cuda")


def test_engine_env_with_a_set_prefix_is_that_sets_alone():
    sets = plan.parse("stock,only-dynamic_draft,dynamic_draft", TINY, "cuda")
    common, per_set = plan.engine_env([("VLLM_LOGGING_LEVEL", "DEBUG"),
                                       ("dynamic_draft:RADIANCE_DRAFT_PIN_DEPTH", "4")], sets)
    assert common == {"VLLM_LOGGING_LEVEL": "DEBUG"}
    assert per_set == {"dynamic_draft": {"RADIANCE_DRAFT_PIN_DEPTH": "4"}}


@pytest.mark.parametrize("key,needle", [("dd:RADIANCE_DRAFT_PIN_DEPTH", "not one of the sets measured"),
                                        ("stock:", "no variable name")])
def test_engine_env_for_a_set_not_measured_is_refused(key, needle):
    sets = plan.parse("stock,only-dynamic_draft", TINY, "cuda")
    with pytest.raises(ValueError, match=needle):
        plan.engine_env([(key, "4")], sets)
