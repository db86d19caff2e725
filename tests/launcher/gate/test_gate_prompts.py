"""The shipped acceptance prompt sets: well-formed, balanced, and frozen once released."""
from __future__ import annotations

import collections

import pytest

from launcher.gate import acceptance
from launcher.gate.config import shipped_prompt_sets

# A released set never changes: figures are comparable only on the same prompts. Add v2 instead.
FROZEN = {"v1": "209edd0e3aadda051a2514824af485436082d6ff6f74366ac5d476127d2abf94"}


def test_every_shipped_set_is_pinned():
    assert set(shipped_prompt_sets()) == set(FROZEN)


@pytest.mark.parametrize("name", sorted(FROZEN))
def test_shipped_set_is_unchanged_and_covers_every_kind(name):
    pset = acceptance.load_prompt_set(name)
    assert pset.sha256 == FROZEN[name]
    kinds = collections.Counter(p.kind for p in pset.prompts)
    assert set(kinds) == set(acceptance.KINDS)
    assert all(p.messages for p in pset.prompts if p.kind == "chat")


def test_user_file_is_validated(tmp_path):
    f = tmp_path / "set.jsonl"
    f.write_text('{"id": "a", "kind": "code", "prompt": "x"}\n{"id": "a", "kind": "code", "prompt": "y"}\n')
    with pytest.raises(acceptance.PromptSetError, match="duplicate id 'a'"):
        acceptance.load_prompt_set(str(f))
    f.write_text('{"id": "a", "kind": "poetry", "prompt": "x"}\n')
    with pytest.raises(acceptance.PromptSetError, match="kind 'poetry'"):
        acceptance.load_prompt_set(str(f))
    f.write_text('{"id": "a", "kind": "chat", "prompt": "x", "messages": []}\n')
    with pytest.raises(acceptance.PromptSetError, match="exactly one of prompt and messages"):
        acceptance.load_prompt_set(str(f))


def test_chat_turns_as_plain_text():
    text = acceptance.messages_as_text([{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Hi"}])
    assert text == "System: Be brief.\n\nUser: Hi\n\nAssistant:"
