"""The gate section of a profile: defaults, unknown keys, and what each validator says."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from launcher.gate.config import GateConfig


def _error(data: dict) -> str:
    with pytest.raises(ValidationError) as exc:
        GateConfig.model_validate(data)
    return str(exc.value)


def test_defaults_are_a_smoke_and_informational_acceptance_gate():
    cfg = GateConfig()
    assert cfg.smoke.enabled and cfg.acceptance.enabled and not cfg.gsm8k.enabled
    assert cfg.acceptance.prompt_set == "v1" and not cfg.acceptance.thresholds_set()
    g = cfg.gsm8k
    assert (g.num_questions, g.seed, g.num_shots, g.max_tokens, g.concurrency, g.retries) == (None, 0, 5, 256, 8, 2)


def test_vllm_ci_style_thresholds():
    cfg = GateConfig.model_validate({
        "acceptance": {"min_mean_acceptance_length": 2.4, "min_acceptance_rate": 0.6,
                       "min_per_position": [0.8, 0.6, 0.4]},
        "gsm8k": {"enabled": True, "threshold": 0.85, "tolerance": 0.08, "num_questions": 200}})
    assert cfg.gsm8k.pass_floor == pytest.approx(0.77)
    assert cfg.acceptance.thresholds_set()


@pytest.mark.parametrize("data, needle", [
    ({"smoke": {"bogus": 1}}, "Extra inputs are not permitted"),
    ({"extra_section": {}}, "Extra inputs are not permitted"),
    ({"acceptance": {"min_mean_acceptance_length": 0.5}}, "never below 1"),
    ({"acceptance": {"min_acceptance_rate": 1.5}}, "between 0 and 1"),
    ({"acceptance": {"min_per_position": []}}, "one rate per draft position"),
    ({"acceptance": {"min_per_position": [0.9, 2]}}, "[2.0] are not fractions"),
    ({"acceptance": {"prompt_set": "v99"}}, "unknown prompt set 'v99'"),
    ({"acceptance": {"max_drop_vs_baseline": 0.2}}, "set baseline: true"),
    ({"gsm8k": {"enabled": True}}, "without a threshold"),
    ({"gsm8k": {"threshold": 85}}, "fraction in (0, 1]"),
    ({"gsm8k": {"threshold": 0.5, "tolerance": 0.5}}, "lets every run pass"),
    ({"gsm8k": {"num_questions": 5000}}, "exceeds the 1319"),
    ({"gsm8k": {"num_questions": 0}}, "greater than or equal to 1"),
    ({"gsm8k": {"num_shots": 8}}, "packaged copy carries train[0:5]"),
    ({"gsm8k": {"concurrency": 0}}, "greater than or equal to 1"),
    ({"smoke": {"prompt": "  "}}, "empty smoke prompt"),
])
def test_bad_values_are_rejected_with_the_fix(data, needle):
    assert needle in _error(data)


def test_more_shots_with_a_data_dir_and_a_prompt_file_path():
    cfg = GateConfig.model_validate({"gsm8k": {"num_shots": 8, "data_dir": "/data/gsm8k"},
                                     "acceptance": {"prompt_set": "./my_prompts.jsonl"}})
    assert cfg.gsm8k.num_shots == 8


def test_round_trips_through_json():
    cfg = GateConfig.model_validate({"gsm8k": {"enabled": True, "threshold": 0.7}})
    assert GateConfig.model_validate_json(cfg.model_dump_json()) == cfg
