"""A byte-level BPE tokenizer trained locally on the fixed corpus, saved in the HF fast format."""

from __future__ import annotations

import json
from pathlib import Path

from tools.tinymodel import config
from tools.tinymodel.corpus import Corpus

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train(corpus: Corpus, vocab_size: int = config.VOCAB_SIZE):
    """Train the BPE; deterministic for a given corpus (counts and tie-breaks are order-free)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus.texts, trainer=trainer, length=len(corpus.texts))
    return tok


def save(tok, out_dir: Path) -> dict[str, int]:
    """Write tokenizer.json + tokenizer_config.json; return the special token ids."""
    ids = {name: tok.token_to_id(name) for name in SPECIAL_TOKENS}
    tok.save(str(out_dir / "tokenizer.json"), pretty=False)
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config.MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(ids[name]): {
                "content": name,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
                "special": True,
            }
            for name in SPECIAL_TOKENS
        },
    }
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(tok_config, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    return {"pad": ids[PAD], "im_start": ids[IM_START], "im_end": ids[IM_END]}
