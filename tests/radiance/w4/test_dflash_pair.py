"""The tiny target + DFlash drafter pair (tools.tinymodel.dflash) the DFlash w4-drafter e2e runs
on: deterministic bytes, the config keys vLLM 0.32 reads, and drafter shapes that put every
decoder linear on the converted side of the w4-drafter's rules (and none, for UNCONVERTIBLE)."""
from __future__ import annotations

import json

import pytest

from tools.tinymodel import dflash
from radiance.w4.patch_drafter import DECLINED_NAMES


def _linears(dims):
    # checkpoint names of 2-D drafter weights -> (N, K); q/k/v and gate/up are fused by vLLM
    return {name.removesuffix(".weight"): shape for name, shape, role in dflash.drafter_layout(dims)
            if role == "linear"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return dflash.write_pair(tmp_path_factory.mktemp("pair"), seed=0)


def test_same_seed_gives_identical_bytes(pair, tmp_path):
    again = dflash.write_pair(tmp_path, seed=0)
    for a, b in zip(pair, again):
        names = sorted(p.name for p in a.iterdir())
        assert names == sorted(p.name for p in b.iterdir())
        for name in names:
            assert (a / name).read_bytes() == (b / name).read_bytes(), (a.name, name)


def test_configs_hold_what_vllm_reads(pair):
    target, drafter = pair
    t = json.loads((target / "config.json").read_text())
    d = json.loads((drafter / "config.json").read_text())
    assert t["architectures"] == ["Qwen3ForCausalLM"] and d["architectures"] == ["DFlashDraftModel"]
    ids = d["dflash_config"]["target_layer_ids"]
    assert ids and max(ids) < t["num_hidden_layers"]
    assert 0 <= d["dflash_config"]["mask_token_id"] < t["vocab_size"]
    assert d["hidden_size"] == t["hidden_size"] and d["vocab_size"] == t["vocab_size"]


def test_drafter_checkpoint_names_and_fc_shape(pair):
    from safetensors import safe_open

    with safe_open(str(pair[1] / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        fc = f.get_slice("fc.weight").get_shape()
    # no embed_tokens / lm_head: vLLM aliases the target's into the drafter
    assert not any("embed_tokens" in n or "lm_head" in n for n in names)
    assert {"fc.weight", "hidden_norm.weight", "norm.weight"} <= names
    assert fc == [dflash.DIMS.hidden, dflash.DIMS.hidden * len(dflash.TARGET_LAYER_IDS)]


def test_agreeing_target_has_the_mask_token_as_a_fixed_point(pair):
    from safetensors.torch import load_file

    mask = json.loads((pair[1] / "config.json").read_text())["dflash_config"]["mask_token_id"]
    sd = load_file(str(pair[0] / "model.safetensors"))
    emb, head = sd["model.embed_tokens.weight"].float(), sd["lm_head.weight"].float()
    h = emb[mask] / emb[mask].pow(2).mean().sqrt()  # what the final RMSNorm (weight 1) hands the head
    assert int((head @ h).argmax()) == mask


@pytest.mark.parametrize("dims, convertible", [(dflash.DIMS, True), (dflash.UNCONVERTIBLE, False)])
def test_drafter_linears_against_the_group_size(dims, convertible):
    for name, (n, k) in _linears(dims).items():
        if name.rsplit(".", 1)[-1] in DECLINED_NAMES:
            continue
        assert (k % 128 == 0) == convertible, (name, n, k)
