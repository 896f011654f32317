"""Tokenize an OpenAI request the way vLLM does, with an in-process Hugging Face tokenizer or the model
server's `/tokenize` endpoint, behind a bounded cache; big prompts are tokenized off the event loop."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from epp.framework.errors import TokenizationError
from epp.tokenization.chat import content_format, conversation, has_media, tool_dicts
from epp.tokenization.segments import SegmentEncoder

log = logging.getLogger(__name__)

__all__ = ["HFBackend", "HTTPBackend", "PromptTokenizer", "TokenizationError"]


class Backend(Protocol):
    renders_media: bool  # True when the backend expands multimodal parts (the engine's own renderer)

    async def completion(self, model: str, prompt: str) -> list[int]: ...

    async def chat(
        self,
        model: str,
        messages: list[dict[str, Any]],
        kwargs: Mapping[str, Any],
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]: ...

    async def warm(self) -> None: ...


class HFBackend:
    """transformers AutoTokenizer per model, loaded from a local directory (offline; one load per directory
    per process, shared by every backend)."""

    renders_media = False

    _loaded: dict[str, Any] = {}
    _load_lock = threading.Lock()

    def __init__(
        self,
        model_dirs: Mapping[str, str | Path],
        default_dir: str | Path | None = None,
        offload_chars: int = 4096,
        executor: ThreadPoolExecutor | None = None,
        chat_template: str | None = None,
    ) -> None:
        self.model_dirs = {k: str(v) for k, v in model_dirs.items()}
        # vLLM's --chat-template: replaces the tokenizer's own template for every model of this backend
        self.chat_template = chat_template
        self.default_dir = str(default_dir) if default_dir else None
        self.offload_chars = offload_chars
        self._tok: dict[str, Any] = {}
        # Chat prompts are encoded a segment (message) at a time; earlier turns come from its cache.
        self._seg: dict[str, SegmentEncoder] = {}
        # One thread: a fast tokenizer must not be used from two threads at once ("Already borrowed").
        self._executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")
        self._offloaded = 0

    def tokenizer(self, model: str) -> Any:
        tok = self._tok.get(model)
        if tok is None:
            d = self.model_dirs.get(model, self.default_dir)
            if d is None:
                raise TokenizationError(f"no tokenizer configured for model {model!r}")
            tok = self._load(d, model)
            self._tok[model] = tok
        return tok

    @staticmethod
    def _load(d: str, model: str) -> Any:
        # The lock makes a request that arrives during `warm()` wait for that load instead of loading twice.
        with HFBackend._load_lock:
            tok = HFBackend._loaded.get(d)
            if tok is None:
                from transformers import AutoTokenizer

                try:
                    tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
                except Exception as e:
                    raise TokenizationError(f"cannot load tokenizer for {model!r} from {d}: {e}") from None
                HFBackend._loaded[d] = tok
        return tok

    def _segments(self, model: str, tok: Any) -> SegmentEncoder:
        enc = self._seg.get(model)
        if enc is None:
            enc = self._seg[model] = SegmentEncoder(tok)
        return enc

    async def warm(self) -> None:
        """Load every configured tokenizer on the tokenizer thread at startup (a load takes seconds: importing
        transformers and reading the vocabulary), so the first requests are not the ones that pay for it."""
        dirs = {d: m for m, d in self.model_dirs.items()}
        if self.default_dir:
            dirs.setdefault(self.default_dir, "<default>")
        loop = asyncio.get_running_loop()
        for d, model in dirs.items():
            try:
                await loop.run_in_executor(self._executor, self._load, d, model)
            except TokenizationError as e:
                log.error("tokenizer preload failed: %s", e)

    async def _run(self, size: int, fn: Any, *args: Any) -> Any:
        """Small prompts inline (cheaper than a thread hop), big ones on the tokenizer thread; while that
        thread is busy everything queues behind it, so the tokenizer is never used concurrently."""
        if size < self.offload_chars and not self._offloaded:
            return fn(*args)
        self._offloaded += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        finally:
            self._offloaded -= 1

    async def completion(self, model: str, prompt: str) -> list[int]:
        tok = self.tokenizer(model)
        # vLLM's completions API encodes with add_special_tokens=True
        ids = await self._run(len(prompt), lambda: tok(prompt, add_special_tokens=True)["input_ids"])
        return list(ids)

    async def chat(
        self,
        model: str,
        messages: list[dict[str, Any]],
        kwargs: Mapping[str, Any],
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        tok = self.tokenizer(model)
        template = self.chat_template or tok.chat_template
        if not isinstance(template, str):
            raise TokenizationError(f"the tokenizer for {model!r} has no chat template")
        convo = conversation(messages, content_format(template))
        tool_list = tool_dicts(tools)
        size = sum(len(str(m.get("content", ""))) for m in convo)

        def render() -> list[int]:
            # vLLM renders the template to text, then encodes it without adding special tokens
            text = tok.apply_chat_template(
                convo, tools=tool_list, chat_template=template, tokenize=False, add_generation_prompt=True, **kwargs
            )
            return self._segments(model, tok).encode(text)

        try:
            return list(await self._run(size, render))
        except TokenizationError:
            raise
        except Exception as e:
            raise TokenizationError(f"chat template failed for {model!r}: {e}") from None


def _chat_body(
    model: str, messages: list[dict[str, Any]], kwargs: Mapping[str, Any], tools: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """The chat request a model server's /tokenize and /render endpoints take (vLLM's field names)."""
    body: dict[str, Any] = {"model": model, "messages": messages, "add_generation_prompt": True}
    if tools is not None:
        body["tools"] = tools
    if kwargs:
        body["chat_template_kwargs"] = dict(kwargs)
    return body


class HTTPBackend:
    """The model server's `POST /tokenize` (vLLM): `{"model", "prompt"}` or `{"model", "messages", ...}`."""

    renders_media = False

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/") + "/tokenize"
        self.timeout = timeout
        self._session: Any = None

    async def _post(self, body: dict[str, Any]) -> list[int]:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        try:
            async with self._session.post(self.url, json=body) as r:
                data = await r.json(content_type=None)
                if r.status != 200:
                    raise TokenizationError(f"{self.url}: HTTP {r.status}: {str(data)[:200]}")
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as e:
            raise TokenizationError(f"{self.url}: {e or type(e).__name__}") from None
        toks = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(toks, list):
            raise TokenizationError(f"{self.url}: response has no token list")
        return toks

    async def completion(self, model: str, prompt: str) -> list[int]:
        return await self._post({"model": model, "prompt": prompt, "add_special_tokens": True})

    async def chat(
        self,
        model: str,
        messages: list[dict[str, Any]],
        kwargs: Mapping[str, Any],
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        body = _chat_body(model, messages, kwargs, tools)
        return await self._post(body)

    async def warm(self) -> None:
        """Nothing to load: the model server tokenizes."""

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class RenderBackend(HTTPBackend):
    """vLLM's render API (llm-d's `vllm` tokenizer): `POST /v1/chat/completions/render` and `/v1/completions/render`
    on `vllm serve` or the GPU-less `vllm launch render`, which return the engine's own token ids (multimodal
    placeholders included)."""

    renders_media = True

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        super().__init__(url, timeout)
        self.base = url.rstrip("/")

    async def _render(self, path: str, body: dict[str, Any]) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        url = self.base + path
        try:
            async with self._session.post(url, json=body) as r:
                data = await r.json(content_type=None)
                if r.status != 200:
                    raise TokenizationError(f"{url}: HTTP {r.status}: {str(data)[:200]}")
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as e:
            raise TokenizationError(f"{url}: {e or type(e).__name__}") from None
        return data

    @staticmethod
    def _ids(data: Any, url: str) -> list[int]:
        ids = data.get("token_ids") if isinstance(data, dict) else None
        if not isinstance(ids, list) or not all(type(t) is int for t in ids):
            raise TokenizationError(f"{url}: the render response has no token_ids")
        return ids

    async def completion(self, model: str, prompt: str) -> list[int]:
        data = await self._render("/v1/completions/render", {"model": model, "prompt": prompt})
        first = data[0] if isinstance(data, list) and data else data
        return self._ids(first, "/v1/completions/render")

    async def chat(
        self,
        model: str,
        messages: list[dict[str, Any]],
        kwargs: Mapping[str, Any],
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        body = _chat_body(model, messages, kwargs, tools)
        body["mm_payload"] = "none"  # only the token layout and item hashes, as cache-aware routers ask for
        return self._ids(await self._render("/v1/chat/completions/render", body), "/v1/chat/completions/render")


def _digest_into(h: Any, obj: Any) -> None:
    """Feed a JSON-like value to a hash, unambiguously (type tags, lengths) and in key order (key order renders).
    Strings go in as their UTF-8 bytes: on the cache-hit path this is what a request pays, and it is ~3x cheaper
    than `json.dumps` (which escapes every non-ASCII character and newline) for an 8k-token prompt."""
    if isinstance(obj, str):
        b = obj.encode("utf-8", "surrogatepass")  # a lone surrogate is a distinct prompt, not an error
        h.update(b"s%d:" % len(b))
        h.update(b)
    elif isinstance(obj, dict):
        h.update(b"d%d:" % len(obj))
        for k, v in obj.items():
            _digest_into(h, k)
            _digest_into(h, v)
    elif isinstance(obj, list | tuple):
        h.update(b"l%d:" % len(obj))
        for v in obj:
            _digest_into(h, v)
    elif obj is None:
        h.update(b"n")
    elif isinstance(obj, bool):
        h.update(b"t" if obj else b"f")
    elif isinstance(obj, int):
        h.update(b"i%d;" % obj)
    elif isinstance(obj, float):
        h.update(b"r" + repr(obj).encode() + b";")
    else:  # anything else as before: its JSON
        b = json.dumps(obj).encode()
        h.update(b"j%d:" % len(b))
        h.update(b)


class PromptTokenizer:
    """Request → token ids, cached (LRU by model + content digest)."""

    def __init__(self, backend: Backend, cache_size: int = 1024) -> None:
        self.backend = backend
        self.cache_size = cache_size
        self._cache: OrderedDict[bytes, list[int]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    async def warm(self) -> None:
        await self.backend.warm()

    async def tokenize(
        self,
        model: str,
        prompt: Any = None,
        messages: Sequence[Any] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Any] | None = None,
    ) -> list[int]:
        if messages is not None:
            msgs = list(messages)
            if has_media(msgs) and not self.backend.renders_media:
                raise TokenizationError("multimodal content needs the model server's renderer (tokenizer type vllm)")
            kw = dict(chat_template_kwargs or {})
            tool_list = list(tools) if tools is not None else None
            key = self._key(model, "chat", [msgs, kw, tool_list])
            got = self._get(key)
            if got is None:
                got = await self.backend.chat(model, msgs, kw, tool_list)
                self._put(key, got)
            return got
        if isinstance(prompt, list):
            if all(type(t) is int for t in prompt):
                return list(prompt)  # already token ids
            if len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            else:
                raise TokenizationError("only a single prompt (string or token ids) can be routed by prefix")
        if not isinstance(prompt, str):
            raise TokenizationError("the request has neither a prompt string nor messages")
        key = self._key(model, "completion", prompt)
        got = self._get(key)
        if got is None:
            got = await self.backend.completion(model, prompt)
            self._put(key, got)
        return got

    @staticmethod
    def _key(model: str, kind: str, content: Any) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        h.update(model.encode() + b"\0" + kind.encode() + b"\0")
        _digest_into(h, content)
        return h.digest()

    def _get(self, key: bytes) -> list[int] | None:
        v = self._cache.get(key)
        if v is None:
            self.misses += 1
            return None
        self.hits += 1
        self._cache.move_to_end(key)
        return v

    def _put(self, key: bytes, v: list[int]) -> None:
        self._cache[key] = v
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
