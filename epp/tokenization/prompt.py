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
from typing import Any, NoReturn, Protocol

from epp.framework.errors import TokenizationError
from epp.framework.types import MultiModalFeature, TokenizedPrompt
from epp.tokenization.chat import content_format, conversation, has_media, tool_dicts
from epp.tokenization.multimodal import (
    MAX_MEDIA_BYTES,
    MediaError,
    MediaRef,
    VisionConfig,
    decode_data_url,
    hash_image,
    inspect_image,
    media_refs,
    part_kind,
)
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
        # Kept per tokenizer directory, not per model name: names come from clients, and with a default directory
        # every name is served (a map by name would grow with each one a client sends).
        self._tok: dict[str, Any] = {}
        # Chat prompts are encoded a segment (message) at a time; earlier turns come from its cache.
        self._seg: dict[str, SegmentEncoder] = {}
        self._vision: dict[str | None, VisionConfig] = {}
        # One thread: a fast tokenizer must not be used from two threads at once ("Already borrowed").
        self._executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")
        self._offloaded = 0

    def _dir(self, model: str) -> str:
        d = self.model_dirs.get(model, self.default_dir)
        if d is None:
            raise TokenizationError(f"no tokenizer configured for model {model!r}")
        return d

    def tokenizer(self, model: str) -> Any:
        """Synchronous access for tools and tests; request paths use `_tokenizer` (never loads on the loop)."""
        d = self._dir(model)
        tok = self._tok.get(d)
        if tok is None:
            tok = self._tok[d] = self._load(d, model)
        return tok

    async def _tokenizer(self, model: str) -> Any:
        """The model's tokenizer; a first load (seconds) runs on the tokenizer thread, queued behind `warm()`,
        so a request for a model that was not preloaded never blocks the event loop."""
        d = self._dir(model)
        tok = self._tok.get(d)
        if tok is None:
            tok = await asyncio.get_running_loop().run_in_executor(self._executor, self._load, d, model)
            self._tok[d] = tok
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

    async def _segments(self, model: str, tok: Any) -> SegmentEncoder:
        """The tokenizer's segment encoder, built on the tokenizer thread: its probes encode a few texts, which
        must not run on the event loop."""
        d = self._dir(model)
        enc = self._seg.get(d)
        if enc is None:
            enc = await asyncio.get_running_loop().run_in_executor(self._executor, SegmentEncoder, tok)
            enc = self._seg.setdefault(d, enc)
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
                tok = await loop.run_in_executor(self._executor, self._load, d, model)
            except TokenizationError as e:
                log.error("tokenizer preload failed: %s", e)
                continue
            if d not in self._seg:
                self._seg[d] = await loop.run_in_executor(self._executor, SegmentEncoder, tok)

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
        tok = await self._tokenizer(model)
        enc = await self._segments(model, tok)
        if enc.completions:
            # Segments and chunks: a prompt that shares its head with an earlier one encodes only the rest, on
            # the loop when that is small.
            big = len(prompt) >= self.offload_chars and not self._offloaded  # else the length decides as before
            size = enc.uncached_chars(prompt) if big else len(prompt)
            return await self._run(size, enc.encode_completion, prompt)
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
        return await self._chat(model, messages, kwargs, tools, media=False)

    async def _chat(
        self,
        model: str,
        messages: list[dict[str, Any]],
        kwargs: Mapping[str, Any],
        tools: list[dict[str, Any]] | None,
        media: bool,
    ) -> list[int]:
        tok = await self._tokenizer(model)
        template = self.chat_template or tok.chat_template
        if not isinstance(template, str):
            raise TokenizationError(f"the tokenizer for {model!r} has no chat template")
        enc = await self._segments(model, tok)
        convo = conversation(messages, content_format(template), media=media)
        tool_list = tool_dicts(tools)
        size = sum(len(str(m.get("content", ""))) for m in convo)

        def render() -> list[int]:
            # vLLM renders the template to text, then encodes it without adding special tokens
            text = tok.apply_chat_template(
                convo, tools=tool_list, chat_template=template, tokenize=False, add_generation_prompt=True, **kwargs
            )
            return enc.encode(text)

        try:
            return list(await self._run(size, render))
        except TokenizationError:
            raise
        except Exception as e:
            raise TokenizationError(f"chat template failed for {model!r}: {e}") from None

    async def check_media(self, model: str) -> None:
        """Raise unless this model's template renders image parts and its tokenizer has the Qwen2-VL pad token."""
        tok = await self._tokenizer(model)
        template = self.chat_template or tok.chat_template
        if not isinstance(template, str) or content_format(template) != "openai":
            raise TokenizationError(f"the chat template of {model!r} renders no image parts: use the renderer")
        pad = tok.convert_tokens_to_ids("<|image_pad|>")
        if not isinstance(pad, int) or pad == tok.unk_token_id:
            raise TokenizationError(f"the tokenizer for {model!r} has no <|image_pad|> token: use the renderer")

    async def vision(self, model: str) -> VisionConfig:
        """The image processor settings of the model's directory (preprocessor_config.json), read once per
        model on the tokenizer thread (no file read on the event loop per request)."""
        d = self.model_dirs.get(model, self.default_dir)
        got = self._vision.get(d)
        if got is None:
            got = await asyncio.get_running_loop().run_in_executor(self._executor, VisionConfig.from_dir, d)
            self._vision[d] = got
        return got

    async def chat_media(
        self,
        model: str,
        messages: list[dict[str, Any]],
        kwargs: Mapping[str, Any],
        tools: list[dict[str, Any]] | None,
        image_tokens: Sequence[int],
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """Render with image parts, then repeat each image's pad token as vLLM's Qwen2-VL processor does: the ids
        and each image's placeholder (offset, length), in order."""
        tok = await self._tokenizer(model)
        pad = tok.convert_tokens_to_ids("<|image_pad|>")
        if not isinstance(pad, int) or pad == tok.unk_token_id:
            raise TokenizationError(f"the tokenizer for {model!r} has no <|image_pad|> token: use the renderer")
        ids = await self._chat(model, messages, kwargs, tools, media=True)
        return expand_placeholders(ids, pad, image_tokens)


def expand_placeholders(ids: list[int], pad: int, counts: Sequence[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """Each `pad` in `ids` repeated counts[k] times (the k-th image); the placeholders' (offset, length)."""
    positions = [i for i, t in enumerate(ids) if t == pad]
    if len(positions) != len(counts):
        raise TokenizationError(
            f"the chat template rendered {len(positions)} image placeholders for {len(counts)} images"
        )
    out: list[int] = []
    ranges: list[tuple[int, int]] = []
    prev = 0
    for pos, n in zip(positions, counts, strict=True):
        out.extend(ids[prev:pos])
        ranges.append((len(out), n))
        out.extend([pad] * n)
        prev = pos + 1
    out.extend(ids[prev:])
    return out, ranges


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


class _HTTPClient:
    """One aiohttp session per owner, opened on first use and closed by `close()` (the runtime's shutdown)."""

    _session: Any = None

    def _client(self, timeout: float) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class HTTPBackend(_HTTPClient):
    """The model server's `POST /tokenize` (vLLM): `{"model", "prompt"}` or `{"model", "messages", ...}`."""

    renders_media = False

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/") + "/tokenize"
        self.timeout = timeout

    async def _post_json(self, url: str, body: dict[str, Any], timeout: float | None = None) -> Any:
        """POST `body` to `url`, the JSON answer; any failure (transport, timeout, non-200, not JSON) is a
        TokenizationError naming the URL."""
        import aiohttp

        extra: dict[str, Any] = {} if timeout is None else {"timeout": aiohttp.ClientTimeout(total=timeout)}
        try:
            async with self._client(self.timeout).post(url, json=body, **extra) as r:
                data = await r.json(content_type=None)
                if r.status != 200:
                    raise TokenizationError(f"{url}: HTTP {r.status}: {str(data)[:200]}")
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as e:
            raise TokenizationError(f"{url}: {e or type(e).__name__}") from None
        return data

    async def _post(self, body: dict[str, Any]) -> list[int]:
        data = await self._post_json(self.url, body)
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


class RenderBackend(HTTPBackend):
    """vLLM's render API (llm-d's `vllm` tokenizer): `POST /v1/chat/completions/render` and `/v1/completions/render`
    on `vllm serve` or the GPU-less `vllm launch render`, which return the engine's own token ids (multimodal
    placeholders included)."""

    renders_media = True

    def __init__(self, url: str, timeout: float = 5.0, mm_timeout: float = 30.0) -> None:
        super().__init__(url, timeout)
        self.base = url.rstrip("/")
        self.mm_timeout = mm_timeout  # llm-d's mmTimeout: a render with media fetches and processes it

    async def _render(self, path: str, body: dict[str, Any], timeout: float | None = None) -> Any:
        return await self._post_json(self.base + path, body, timeout)

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
        return (await self.chat_prompt(model, messages, kwargs, tools)).token_ids

    async def chat_prompt(
        self,
        model: str,
        messages: list[dict[str, Any]],
        kwargs: Mapping[str, Any],
        tools: list[dict[str, Any]] | None = None,
    ) -> TokenizedPrompt:
        """The engine's ids and its multimodal features (`features.mm_hashes` / `mm_placeholders`)."""
        body = _chat_body(model, messages, kwargs, tools)
        body["mm_payload"] = "none"  # only the token layout and item hashes, as cache-aware routers ask for
        timeout = self.mm_timeout if has_media(messages) else None
        data = await self._render("/v1/chat/completions/render", body, timeout)
        ids = self._ids(data, "/v1/chat/completions/render")
        return TokenizedPrompt(ids, render_features(data.get("features"), len(ids)))


def render_features(features: Any, num_tokens: int) -> list[MultiModalFeature] | None:
    """vLLM's `MultiModalFeatures` ({mm_hashes: {modality: [hash]}, mm_placeholders: {modality: [{offset, length}]}})
    as features sorted by offset; malformed or out-of-range entries make the whole set unusable (None)."""
    if not isinstance(features, dict):
        return None
    hashes, places = features.get("mm_hashes"), features.get("mm_placeholders")
    if not isinstance(hashes, dict) or not isinstance(places, dict):
        return None
    out: list[MultiModalFeature] = []
    for modality, hs in hashes.items():
        ps = places.get(modality)
        if not isinstance(hs, list) or not isinstance(ps, list) or len(hs) != len(ps):
            return None
        for h, p in zip(hs, ps, strict=True):
            off = p.get("offset") if isinstance(p, dict) else None
            length = p.get("length") if isinstance(p, dict) else None
            if not isinstance(h, str) or type(off) is not int or type(length) is not int:
                return None
            if off < 0 or length <= 0 or off + length > num_tokens:
                return None
            out.append(MultiModalFeature(str(modality)[:16], h, off, length))
    out.sort(key=lambda f: f.offset)
    return out or None


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


class PromptTokenizer(_HTTPClient):
    """Request → token ids, cached (LRU by model + content digest)."""

    def __init__(
        self,
        backend: Backend,
        cache_size: int = 1024,
        mm_hash_algorithm: str = "blake3",
        media_timeout: float = 5.0,
        max_media_bytes: int = MAX_MEDIA_BYTES,
    ) -> None:
        self.backend = backend
        self.cache_size = cache_size
        self._cache: OrderedDict[bytes, Any] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.mm_hash_algorithm = mm_hash_algorithm
        self.media_timeout = media_timeout
        self.max_media_bytes = max_media_bytes
        self._images: OrderedDict[bytes, tuple[str, int, int]] = OrderedDict()  # url digest -> (hash, w, h)

    async def tokenize_prompt(
        self,
        model: str,
        prompt: Any = None,
        messages: Sequence[Any] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Any] | None = None,
        mm_model_id: str | None = None,
    ) -> TokenizedPrompt:
        """Token ids with multimodal placeholders expanded, and each item's vLLM mm hash and placeholder range.

        Media in chat messages: the render backend returns the engine's own features; a local tokenizer expands
        images itself (epp.tokenization.multimodal). `mm_model_id` is the model vLLM hashes items with (its
        `--model`; default `model`)."""
        if messages is None or (not has_media(list(messages)) and not _untyped_media(messages)):
            return TokenizedPrompt(await self.tokenize(model, prompt, messages, chat_template_kwargs, tools))
        msgs, kw, tool_list = _chat_args(messages, chat_template_kwargs, tools)
        long_strings: list[str] = []
        keyable = _keyable([msgs, kw, tool_list, mm_model_id], long_strings)
        if long_strings:  # media URLs: fingerprinted (blake3), off the event loop when large
            size = sum(len(x) for x in long_strings)
            digests = await asyncio.to_thread(_digests, long_strings) if size > 262144 else _digests(long_strings)
            keyable = [keyable, digests]
        key = self._key(model, "chat-mm", keyable)
        got = self._get(key)
        if isinstance(got, TokenizedPrompt):
            return got
        render = getattr(self.backend, "chat_prompt", None)
        chat_media = getattr(self.backend, "chat_media", None)
        if render is not None:
            got = await render(model, msgs, kw, tool_list)
        elif self.backend.renders_media:  # the engine's ids, without the items (e.g. the UDS sidecar's answer)
            got = TokenizedPrompt(await self.backend.chat(model, msgs, kw, tool_list))
        else:
            if chat_media is None:
                raise TokenizationError("multimodal content needs the model server's renderer (tokenizer type vllm)")
            refs = media_refs(msgs)
            await self.backend.check_media(model)  # type: ignore[attr-defined]  # before any decode or fetch
            vision: VisionConfig = await self.backend.vision(model)  # type: ignore[attr-defined]
            images = [await self._image(ref, mm_model_id or model) for ref in refs]
            counts = [vision.image_tokens(w, h) for _, w, h in images]
            ids, ranges = await chat_media(model, msgs, kw, tool_list, counts)
            feats = [MultiModalFeature("image", h, off, n) for (h, _, _), (off, n) in zip(images, ranges, strict=True)]
            got = TokenizedPrompt(ids, feats or None)
        self._put(key, got)
        return got

    async def _image(self, ref: MediaRef, model_id: str) -> tuple[str, int, int]:
        """(mm hash, width, height) of one image part, remembered by URL for later turns of the conversation."""
        if ref.url is None:
            raise MediaError("an image part has no URL")
        url = ref.url
        if len(url) > _LONG:
            url = (await asyncio.to_thread(_digests, [url]) if len(url) > 262144 else _digests([url]))[0]
        digest = self._key(model_id, "image", [url, ref.uuid, self.mm_hash_algorithm])
        got = self._images.get(digest)
        if got is not None:
            self._images.move_to_end(digest)
            return got
        data = await self._media_bytes(ref.url)
        algorithm = self.mm_hash_algorithm

        def inspect() -> tuple[str, int, int]:
            info = inspect_image(data)
            h = ref.uuid if ref.uuid is not None else hash_image(model_id, info.media, algorithm)
            return h, info.width, info.height

        got = await asyncio.to_thread(inspect) if len(data) > 65536 else inspect()
        self._images[digest] = got
        if len(self._images) > 256:
            self._images.popitem(last=False)
        return got

    async def _media_bytes(self, url: str) -> bytes:
        """A data: URL decoded, or an http(s) URL fetched within `media_timeout` and `max_media_bytes`."""
        if url[:5].lower() == "data:":
            if len(url) > 65536:
                return await asyncio.to_thread(decode_data_url, url)
            return decode_data_url(url)
        if not url.lower().startswith(("http://", "https://")):
            raise MediaError(f"unsupported media URL scheme in {url[:40]!r}")
        import aiohttp

        try:
            async with self._client(self.media_timeout).get(url) as r:
                if r.status != 200:
                    raise MediaError(f"fetching {url[:80]}: HTTP {r.status}")
                if (r.content_length or 0) > self.max_media_bytes:
                    raise MediaError(f"fetching {url[:80]}: larger than {self.max_media_bytes} bytes")
                buf = bytearray()
                async for chunk in r.content.iter_chunked(65536):
                    buf += chunk
                    if len(buf) > self.max_media_bytes:
                        raise MediaError(f"fetching {url[:80]}: larger than {self.max_media_bytes} bytes")
                return bytes(buf)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise MediaError(f"fetching {url[:80]}: {e or type(e).__name__}") from None

    async def warm(self) -> None:
        await self.backend.warm()

    async def close(self) -> None:
        """Close the media session and the backend's connection (the runtime's shutdown)."""
        await super().close()
        close = getattr(self.backend, "close", None)
        if close is not None:
            await close()

    async def tokenize(
        self,
        model: str,
        prompt: Any = None,
        messages: Sequence[Any] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Any] | None = None,
    ) -> list[int]:
        if messages is not None:
            msgs, kw, tool_list = _chat_args(messages, chat_template_kwargs, tools)
            if has_media(msgs) and not self.backend.renders_media:
                raise TokenizationError("multimodal content needs the model server's renderer (tokenizer type vllm)")
            key = self._key(model, "chat", [msgs, kw, tool_list])
            got = self._get(key)
            if got is None:
                try:
                    got = await self.backend.chat(model, msgs, kw, tool_list)
                except (TypeError, UnicodeError) as e:
                    _surrogate_error([msgs, kw, tool_list], e)
                self._put(key, got)
            return got
        if isinstance(prompt, list):
            if all(type(t) is int for t in prompt):
                if not all(0 <= t <= 0xFFFFFFFF for t in prompt):
                    raise TokenizationError("token ids must be in [0, 2**32)")
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
            try:
                got = await self.backend.completion(model, prompt)
            except (TypeError, UnicodeError) as e:
                _surrogate_error(prompt, e)
            self._put(key, got)
        return got

    @staticmethod
    def _key(model: str, kind: str, content: Any) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        h.update(model.encode("utf-8", "surrogatepass") + b"\0" + kind.encode() + b"\0")
        _digest_into(h, content)
        return h.digest()

    def _get(self, key: bytes) -> Any:
        v = self._cache.get(key)
        if v is None:
            self.misses += 1
            return None
        self.hits += 1
        self._cache.move_to_end(key)
        return v

    def _put(self, key: bytes, v: Any) -> None:
        self._cache[key] = v
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)


def _has_surrogate(obj: Any, depth: int = 0) -> bool:
    if isinstance(obj, str):
        try:
            obj.encode()
        except UnicodeEncodeError:
            return True
        return False
    if depth > 64:
        return False
    if isinstance(obj, dict):
        return any(_has_surrogate(k, depth + 1) or _has_surrogate(v, depth + 1) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return any(_has_surrogate(v, depth + 1) for v in obj)
    return False


def _surrogate_error(content: Any, e: Exception) -> NoReturn:
    """A tokenizer's TypeError/UnicodeError on text with a lone surrogate (a `\\ud800` escape a client sent) is
    the client's input, not our failure: a TokenizationError (no prefix score, one line); anything else re-raises."""
    if _has_surrogate(content):
        raise TokenizationError("the prompt holds a lone surrogate (an unpaired \\ud800-\\udfff escape)") from None
    raise e


def _chat_args(
    messages: Sequence[Any], chat_template_kwargs: Mapping[str, Any] | None, tools: Sequence[Any] | None
) -> tuple[list[Any], dict[str, Any], list[Any] | None]:
    """A chat request's arguments as every backend takes them: messages and tools as lists (tools None when
    absent), the template kwargs as a dict."""
    return list(messages), dict(chat_template_kwargs or {}), (list(tools) if tools is not None else None)


def _untyped_media(messages: Sequence[Any]) -> bool:
    """Media parts without a `type` (vLLM accepts `{"image_url": ...}` alone)."""
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(
            isinstance(p, dict) and p.get("type") is None and part_kind(p) is not None for p in content
        ):
            return True
    return False


_LONG = 1024  # strings longer than this (data URLs) enter cache keys as their blake3 digest


def _keyable(obj: Any, long_strings: list[str]) -> Any:
    """`obj` with every long string replaced by its index in `long_strings` (collected for fingerprinting):
    json.dumps and blake2b over megabytes of base64 cost tens of milliseconds on the event loop."""
    if isinstance(obj, str):
        if len(obj) > _LONG:
            long_strings.append(obj)
            return {"\x00long": len(long_strings) - 1}
        return obj
    if isinstance(obj, dict):
        return {k: _keyable(v, long_strings) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_keyable(v, long_strings) for v in obj]
    return obj


def _digests(strings: list[str]) -> list[str]:
    from blake3 import blake3

    return [f"{len(x)}:{blake3(x.encode('utf-8', 'surrogatepass')).hexdigest()}" for x in strings]
