"""tools/tinymodel, the tiny test-model generator: deterministic bytes, the config vLLM needs, a working
tokenizer; and how the launcher reaches it for a random-weight builtin model."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tools import tinymodel
from tools.tinymodel import config, generate

MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "radiance_tiny.json",
    "tokenizer.json",
    "tokenizer_config.json",
)


@pytest.fixture(scope="module")
def two_models(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return (
        tinymodel.generate_into(root / "a", seed=0),
        tinymodel.generate_into(root / "b", seed=0),
    )


def test_same_seed_gives_identical_bytes(two_models):
    a, b = two_models
    assert sorted(p.name for p in a.iterdir()) == sorted(MODEL_FILES)
    for name in MODEL_FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_other_seed_changes_only_weights(two_models, tmp_path):
    a, _ = two_models
    c = tinymodel.generate_into(tmp_path / "c", seed=1)
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (c / "tokenizer.json").read_bytes()


def test_config_is_a_hybrid_qwen3_next_with_one_mtp_layer(two_models):
    cfg = json.loads((two_models[0] / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3NextForCausalLM"]
    assert cfg["model_type"] == "qwen3_next"
    assert cfg["torch_dtype"] == "bfloat16"
    assert cfg["num_nextn_predict_layers"] == 1
    assert cfg["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert cfg["num_experts"] > cfg["num_experts_per_tok"] >= 1
    assert cfg["shared_expert_intermediate_size"] > 0
    # vLLM's CPU attention backend accepts only some head sizes.
    assert cfg["head_dim"] in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


@pytest.mark.parametrize("tp", [1, 2])
def test_config_splits_evenly_over_tp(tp):
    cfg = config.hf_config(bos_id=None, eos_id=2, pad_id=0)
    for key in (
        "num_attention_heads",
        "num_key_value_heads",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
    ):
        assert cfg[key] % tp == 0, key
    assert cfg["num_experts"] >= tp


def test_weights_match_the_layout_vllm_loads(two_models):
    from safetensors import safe_open

    with safe_open(str(two_models[0] / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        for name, shape, _role in config.tensor_layout():
            assert tuple(f.get_slice(name).get_shape()) == shape, name
        assert f.get_slice("model.layers.0.linear_attn.A_log").get_dtype() == "F32"
        assert f.get_slice("lm_head.weight").get_dtype() == "BF16"
    assert names == {name for name, _, _ in config.tensor_layout()}
    # vLLM's qwen3_next_mtp loader maps mtp.* onto its own module tree.
    for needed in ("mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
                   "mtp.norm.weight", "mtp.layers.0.self_attn.q_proj.weight",
                   "mtp.layers.0.mlp.experts.0.down_proj.weight"):
        assert needed in names


def test_tokenizer_round_trips_and_knows_the_chat_tokens(two_models):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(two_models[0] / "tokenizer.json"))
    assert tok.get_vocab_size() <= config.VOCAB_SIZE
    for text in ("def add(a, b):\n    return a + b\n", '{"k": [1, 2.5, null]}', "Natalia sold 48 clips. ünï €"):
        assert tok.decode(tok.encode(text).ids) == text
    im_end = tok.token_to_id("<|im_end|>")
    assert tok.encode("hi<|im_end|>").ids[-1] == im_end
    tok_cfg = json.loads((two_models[0] / "tokenizer_config.json").read_text())
    assert tok_cfg["eos_token"] == "<|im_end|>" and "<|im_start|>" in tok_cfg["chat_template"]
    cfg = json.loads((two_models[0] / "config.json").read_text())
    assert cfg["eos_token_id"] == im_end


def test_missing_gsm8k_falls_back_to_builtin_corpus(tmp_path):
    model = tinymodel.generate_into(tmp_path / "m", seed=0, gsm8k_dir=tmp_path / "nowhere")
    meta = json.loads((model / generate.METADATA_FILE).read_text())
    assert "builtin" in meta["corpus_sources"]
    assert len(meta["corpus_sha256"]) == 64


def test_ensure_generates_once_and_reuses(tmp_path, capsys):
    cache = tmp_path / "cache"
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda _: tinymodel.ensure(cache, seed=3), range(2))
    assert first == second == cache / "tiny-qwen3next-s3"
    assert tinymodel.is_complete(first)
    assert "generating the tiny test model tiny-qwen3next (Qwen3NextForCausalLM" in capsys.readouterr().err
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    assert tinymodel.ensure(cache, seed=3) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime
    # No temp dirs left behind by the atomic rename.
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == ["tiny-qwen3next-s3"]


def test_qwen35_is_dense_flat_gdn_and_blocks_at_tp2(tmp_path):
    """The Qwen3.5 tiny: Qwen3_5ForCausalLM, a dense MLP everywhere, the GDN projections stored
    flat (vLLM fuses them), MTP depth under its Qwen3.5 name; block-fp8 converts everything a
    TP=2 rank can hold in whole 128x128 blocks, i.e. all but in_proj_b/a (4 rows)."""
    from tools.tinymodel import fp8

    a = config.QWEN3_5
    model = tinymodel.ensure(tmp_path, seed=0, arch=a.name)
    assert model.name == "tiny-qwen3.5-s0"
    cfg = json.loads((model / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5ForCausalLM"] and cfg["model_type"] == "qwen3_5_text"
    assert cfg["mtp_num_hidden_layers"] == 1 and "num_experts" not in cfg
    names = [n for n, _, _ in config.tensor_layout(arch=a)]
    assert not any(".experts." in n or "in_proj_qkvz" in n for n in names)
    assert "model.layers.0.linear_attn.in_proj_qkv.weight" in names
    assert "model.layers.0.linear_attn.in_proj_z.weight" in names
    assert "mtp.layers.0.mlp.gate_up_proj.weight" not in names and "mtp.layers.0.mlp.down_proj.weight" in names
    converted, kept = fp8.converted_modules(config.tensor_layout(arch=a))
    assert all(m.endswith(("in_proj_b", "in_proj_a")) for m in kept if m.startswith("model.layers"))
    assert "model.layers.3.self_attn.k_proj" in converted and "model.layers.0.linear_attn.in_proj_z" in converted
    with pytest.raises(ValueError, match="dense in every layer"):
        config.check_mlp_only_layers([0], a)


def test_importing_the_package_does_not_import_torch():
    code = "import sys, tools.tinymodel; print('torch' in sys.modules, 'tokenizers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.split() == ["False", "False"]


def test_the_launcher_reaches_the_generator_in_the_checkout_and_says_so_without_one(tmp_path):
    from launcher import paths
    from launcher.errors import LauncherError

    assert paths.tinymodel() is tinymodel and paths.tinymodel("config") is config
    with pytest.raises(LauncherError, match="tools/tinymodel"):
        paths.tinymodel("no_such_part", repo_root=tmp_path)


def test_builtin_models_resolve_committed_first_then_generated(tmp_path, repo_root):
    """The demo's model (profiles/tiny-cpu.yaml) is committed: resolving it generates nothing."""
    from launcher import engine_args, preflight
    from launcher.profile import load_profile

    demo = load_profile(repo_root / "profiles" / "tiny-cpu.yaml")
    arg, model_dir = engine_args.resolve_model(demo, tmp_path / "cache", repo_root)
    assert model_dir == repo_root / "models" / "tiny-qwen3.5-trained" and arg == str(model_dir)
    assert not (tmp_path / "cache").exists()
    assert preflight.model_facts(demo).source == "config.json"
    random = demo.model_copy(update={"model": demo.model.model_copy(update={"path": "builtin:tiny-qwen3.5"})})
    facts = preflight.model_facts(random)   # the generator's config, before any weights exist
    assert facts.architecture == config.QWEN3_5.architecture and facts.mtp_layers == 1


def test_cli_refuses_to_overwrite_without_force(tmp_path):
    from click.testing import CliRunner

    from tools.tinymodel.__main__ import main

    out = tmp_path / "m"
    out.mkdir()
    (out / "keep").write_text("x")
    result = CliRunner().invoke(main, ["--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 2
    assert "--force" in result.output
    assert (out / "keep").exists()


def test_committed_trained_model_matches_the_layout():
    from safetensors import safe_open

    model = tinymodel.trained_model_dir()
    if model is None:
        pytest.skip("models/tiny-qwen3next-trained is not in this checkout")
    meta = json.loads((model / generate.METADATA_FILE).read_text())
    assert meta["kind"] == "trained"
    assert sum(p.stat().st_size for p in model.iterdir()) <= 25 * 2**20
    assert json.loads((model / "config.json").read_text()) == config.hf_config(
        bos_id=None, eos_id=meta_eos(model), pad_id=meta_pad(model)
    )
    with safe_open(str(model / "model.safetensors"), framework="pt") as f:
        assert set(f.keys()) == {name for name, _, _ in config.tensor_layout()}
        for name, shape, _role in config.tensor_layout():
            assert tuple(f.get_slice(name).get_shape()) == shape, name


def meta_eos(model: Path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model / "tokenizer.json")).token_to_id("<|im_end|>")


def meta_pad(model: Path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model / "tokenizer.json")).token_to_id("<|endoftext|>")
