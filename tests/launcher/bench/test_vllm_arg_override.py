"""`radiance bench --vllm-arg KEY=VALUE`: overrides one of the profile's vllm_args under the profile's own rules."""
import pytest

from launcher import errors
from launcher.commands import bench
from launcher.commands._common import load

PROFILE = "profiles/qwen3.5-27b-dummy-tp1.yaml"


def test_override_parses_yaml_scalars_and_keeps_the_rest():
    p = bench._with_vllm_args(load(PROFILE), ("enforce-eager=true", "max-num-seqs=16"))
    assert p.vllm_args["enforce-eager"] is True
    assert p.vllm_args["max-num-seqs"] == 16
    assert p.vllm_args["load-format"] == "dummy"
    assert p.name == "qwen3.5-27b-dummy-tp1" and p.model.path == "builtin:qwen3.5-27b-shape"


def test_a_json_value_goes_to_vllm_as_the_text_given():
    raw = '{"num_hidden_layers": 4}'
    p = bench._with_vllm_args(load(PROFILE), (f"hf-overrides={raw}", 'compilation-config=[1, 2]'))
    assert p.vllm_args["hf-overrides"] == raw and p.vllm_args["compilation-config"] == "[1, 2]"


def test_no_override_is_the_same_profile():
    p = load(PROFILE)
    assert bench._with_vllm_args(p, ()) is p


@pytest.mark.parametrize("item,needle", [
    ("tensor-parallel-size=2", "parallel.tp"),
    ("--enforce-eager=true", "without dashes"),
    ("enforce-eager", "KEY=VALUE"),
])
def test_bad_override_is_a_usage_error(item, needle):
    with pytest.raises(errors.UsageError, match=needle):
        bench._with_vllm_args(load(PROFILE), (item,))


def test_a_sets_engine_env_reaches_that_engine_alone_and_a_bad_knob_is_refused(tmp_path):
    from launcher.bench import plan, run

    profile = load(PROFILE)
    sets = plan.parse("stock,only-dynamic_draft,dynamic_draft", profile, "cuda")
    common, per_set = bench._engine_env(("dynamic_draft:RADIANCE_DRAFT_PIN_DEPTH=4",), sets)
    opts = run.Options(batches=[1], max_tokens=8, engine_env=common, set_env=per_set)
    engines = {fs.name: run._engine(fs, profile, "cuda", opts, tmp_path) for fs in sets}
    assert engines["dynamic_draft"].env["RADIANCE_DRAFT_PIN_DEPTH"] == "4"
    assert "RADIANCE_DRAFT_PIN_DEPTH" not in engines["only-dynamic_draft"].env
    with pytest.raises(errors.UsageError, match="RADIANCE_DRAFT_PIN_DEPTH"):
        bench._engine_env(("dynamic_draft:RADIANCE_DRAFT_PIN_DEPTH=-1",), sets)
