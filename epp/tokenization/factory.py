"""A PromptTokenizer from a plugin's parameters: `tokenizer: {type: hf|vllm, models, dir, url, cacheSize, ...}`,
llm-d's `vllm: {url, timeout}`, or the same keys at the top level. Without a model map or directory the bundled
Qwen2.5 tokenizer is used."""

from __future__ import annotations

from epp.framework.params import Params
from epp.tokenization.prompt import HFBackend, HTTPBackend, PromptTokenizer

_HTTP_TYPES = ("vllm", "http", "server")
_LOCAL_TYPES = ("hf", "local")


def tokenizer_from_params(params: Params) -> PromptTokenizer:
    cfg = params.section("tokenizer") if params.has("tokenizer") else params
    vllm = cfg.section("vllm")
    default_type = "vllm" if vllm.raw else "hf"
    kind = cfg.str("type", default_type).lower()
    if kind not in (*_LOCAL_TYPES, *_HTTP_TYPES):
        raise cfg.fail("type", "must be hf (a local tokenizer) or vllm (the model server's /tokenize)")
    size = cfg.int("cacheSize", 1024, min=1)
    if kind in _HTTP_TYPES:
        url = cfg.optional_str("url") or vllm.optional_str("url") or "http://localhost:8000"
        timeout = cfg.duration("timeout", vllm.duration("timeout", 5.0))
        return PromptTokenizer(HTTPBackend(url, timeout), size)
    models = cfg.mapping("models") if cfg.has("models") else cfg.mapping("modelTokenizerMap")
    default_dir = cfg.optional_str("dir")
    if not models and not default_dir:
        from epp.tokenization.qwen import qwen25_tokenizer_dir

        default_dir = str(qwen25_tokenizer_dir())
    dirs = {str(k): str(v) for k, v in models.items()}
    return PromptTokenizer(HFBackend(dirs, default_dir, cfg.int("offloadChars", 4096, min=0)), size)
