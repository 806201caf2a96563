"""A small byte-level BPE tokenizer with a ChatML chat template, trained locally (no hub).

Trained on a fixed, sorted slice of the running Python's standard library, so the same
interpreter always yields the same vocabulary. Saved in the layout transformers and vLLM
load from a model directory: `tokenizer.json`, `tokenizer_config.json`,
`special_tokens_map.json` and `chat_template.jinja`.
"""

from __future__ import annotations

import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 2048
CORPUS_FILES = 120  # stdlib modules, enough for 2048 merges in a few seconds
MAX_CONTEXT_TOKENS = 512
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (BOS, EOS, PAD, IM_START, IM_END)  # ids 0..4, in this order

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class SpecialIds:
    """Token ids the model configs refer to."""

    bos: int
    eos: int
    pad: int


def corpus_files(count: int = CORPUS_FILES) -> list[Path]:
    """The first `count` standard-library modules by name: a deterministic local corpus."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(stdlib.glob("*.py"))[:count]


def train_tokenizer(files: list[Path], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """A byte-level BPE with the special tokens first, trained on `files`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(f) for f in files], trainer)
    return tokenizer


def special_ids(tokenizer: Tokenizer) -> SpecialIds:
    """The ids of the begin, end and padding tokens."""
    ids = [tokenizer.token_to_id(t) for t in (BOS, EOS, PAD)]
    bos, eos, pad = (i for i in ids if i is not None)
    return SpecialIds(bos=bos, eos=eos, pad=pad)


def tokenizer_config() -> dict[str, object]:
    """`tokenizer_config.json`: the fast-tokenizer class, special tokens and chat template."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": MAX_CONTEXT_TOKENS,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }


def save_tokenizer(tokenizer: Tokenizer, directory: Path) -> None:
    """Write the tokenizer files into a model directory."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    write_json(directory / "tokenizer_config.json", tokenizer_config())
    specials = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    write_json(directory / "special_tokens_map.json", specials)
    (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")


def write_json(path: Path, document: object) -> None:
    """Write `document` as stable, readable JSON."""
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
