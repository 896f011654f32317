"""A PromptTokenizer from a plugin's parameters: `tokenizer: {type: hf|vllm|tokenize, models, dir, url, cacheSize,
chatTemplate, ...}`, llm-d's `vllm: {url, timeout}`, or the same keys at the top level.

`vllm` (llm-d's backend) asks the model server's render API (`/v1/chat/completions/render`,
`/v1/completions/render`); `tokenize` its `/tokenize`; `hf` loads local tokenizers (`chatTemplate` replaces their
template, as vLLM's --chat-template). Without a model map or directory the bundled Qwen2.5 tokenizer is used.
llm-d's deprecated `udsTokenizerConfig: {socketFile, useTCP, modelTokenizerMap}` (with `modelName`) asks the UDS
tokenizer sidecar over gRPC (epp/tokenization/uds.py)."""

from __future__ import annotations

import logging
from pathlib import Path

from epp.framework.params import Params
from epp.tokenization.multimodal import HASH_ALGORITHMS
from epp.tokenization.prompt import HFBackend, HTTPBackend, PromptTokenizer, RenderBackend

log = logging.getLogger(__name__)

_RENDER_TYPES = ("vllm", "render")
_HTTP_TYPES = ("tokenize", "http", "server")
_LOCAL_TYPES = ("hf", "local")


def _uds_tokenizer(params: Params, uds: Params, socket_file: str) -> PromptTokenizer:
    """llm-d's deprecated `udsTokenizerConfig` (the gRPC sidecar): needs `modelName`, excludes `vllm`."""
    from epp.tokenization.uds import UDSBackend, resolve_model

    if params.has("vllm") or params.has("tokenizer"):
        raise params.fail("udsTokenizerConfig", "only one of 'vllm', 'tokenizer' and 'udsTokenizerConfig' may be set")
    model = params.optional_str("modelName")
    if not model:
        raise params.fail("udsTokenizerConfig", "needs 'modelName' (the model whose tokenizer the sidecar loads)")
    try:
        resolved = resolve_model(model, {str(k): str(v) for k, v in uds.mapping("modelTokenizerMap").items()})
    except ValueError as e:
        raise uds.fail("modelTokenizerMap", str(e)) from None
    log.warning("udsTokenizerConfig (the UDS tokenizer sidecar) is deprecated in llm-d; prefer vllm.url")
    # workersCount: llm-d-kv-cache's pool size (set when the precise scorer's tokenizersPoolConfig configures this
    # tokenizer): at most that many sidecar calls at once.
    workers = uds.int("workersCount", 0, min=0)
    backend = UDSBackend(socket_file, resolved, use_tcp=uds.bool("useTCP", False), max_in_flight=workers)
    return PromptTokenizer(backend, params.int("cacheSize", 1024, min=1))


def tokenizer_from_params(params: Params) -> PromptTokenizer:
    if params.has("udsTokenizerConfig"):
        uds = params.section("udsTokenizerConfig")
        socket_file = uds.str("socketFile", "")
        if socket_file:  # llm-d: the sidecar is on when socketFile is set
            return _uds_tokenizer(params, uds, socket_file)
        uds.bool("useTCP", False)
        uds.mapping("modelTokenizerMap")
        uds.int("workersCount", 0, min=0)
    cfg = params.section("tokenizer") if params.has("tokenizer") else params
    vllm = cfg.section("vllm")
    default_type = "vllm" if vllm.raw else "hf"
    kind = cfg.str("type", default_type).lower()
    if kind not in (*_LOCAL_TYPES, *_HTTP_TYPES, *_RENDER_TYPES):
        raise cfg.fail(
            "type", "must be hf (a local tokenizer), vllm (the model server's render API) or tokenize (its /tokenize)"
        )
    size = cfg.int("cacheSize", 1024, min=1)
    # Multimodal: vLLM's --mm-hasher-algorithm, and llm-d's mmTimeout (a render with media; our own image fetches)
    algorithm = cfg.str("mmHashAlgorithm", "blake3", choices=HASH_ALGORITHMS)
    mm_timeout = cfg.duration("mmTimeout", vllm.duration("mmTimeout", 30.0))
    if kind in (*_HTTP_TYPES, *_RENDER_TYPES):
        url = cfg.optional_str("url") or vllm.optional_str("url") or "http://localhost:8000"
        timeout = cfg.duration("timeout", vllm.duration("timeout", 5.0))
        remote = RenderBackend(url, timeout, mm_timeout) if kind in _RENDER_TYPES else HTTPBackend(url, timeout)
        return PromptTokenizer(remote, size, algorithm, mm_timeout)
    template = cfg.optional_str("chatTemplate")
    if template is not None and "{" not in template:  # a file, as vLLM's --chat-template accepts
        try:
            template = Path(template).read_text()
        except OSError as e:
            raise cfg.fail("chatTemplate", f"cannot read the template file: {e.strerror}") from None
    models = cfg.mapping("models") if cfg.has("models") else cfg.mapping("modelTokenizerMap")
    default_dir = cfg.optional_str("dir")
    if not models and not default_dir:
        from epp.tokenization.qwen import qwen25_tokenizer_dir

        default_dir = str(qwen25_tokenizer_dir())
    dirs = {str(k): str(v) for k, v in models.items()}
    backend = HFBackend(dirs, default_dir, cfg.int("offloadChars", 4096, min=0), chat_template=template)
    return PromptTokenizer(backend, size, algorithm, mm_timeout)
