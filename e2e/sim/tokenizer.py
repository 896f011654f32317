"""Prompt → token ids exactly as vLLM renders them, with the same Qwen2.5 tokenizer the EPP loads.

Completions: `encode(prompt)` (Qwen adds no BOS), or the given token ids. Chat:
`apply_chat_template(messages, add_generation_prompt=True)` then encode without special-token additions,
as vLLM does. Big inputs are tokenized in a worker thread so the event loop never stalls.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from epp.tokenization.qwen import load_qwen25_tokenizer

THREAD_THRESHOLD_CHARS = 4096


_SHARED: SimTokenizer | None = None


def shared_tokenizer() -> SimTokenizer:
    """One tokenizer per process, for simulators started in-process (tests)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = SimTokenizer()
    return _SHARED


class RenderError(ValueError):
    pass


class SimTokenizer:
    def __init__(self) -> None:
        self.tok: Any = load_qwen25_tokenizer()
        self.lock = threading.Lock()
        self.vocab_size = len(self.tok)

    # --- sync core (not thread-safe: from the event loop call these through `run`) ----------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens))

    def chat_text(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        text = self.tok.apply_chat_template(
            [_flatten(m) for m in messages],
            tokenize=False,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message,
            **(chat_template_kwargs or {}),
        )
        return str(text)

    def chat_ids(self, messages: list[dict[str, Any]], add_special_tokens: bool = False, **kw: Any) -> list[int]:
        return self.encode(self.chat_text(messages, **kw), add_special_tokens=add_special_tokens)

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids))

    def token_strs(self, ids: list[int]) -> list[str]:
        return [str(t) for t in self.tok.convert_ids_to_tokens(ids)]

    # --- request-level helpers ------------------------------------------------------------------------
    def check_ids(self, ids: Any) -> list[int]:
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise RenderError("token ids must be a list of integers")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RenderError(f"token id {bad[0]} is out of vocabulary (size {self.vocab_size})")
        return ids

    async def prompt_ids(self, prompt: Any, add_special_tokens: bool = True) -> list[list[int]]:
        """A completions `prompt` (str, [str], [int] or [[int]]) as one id list per prompt."""
        if isinstance(prompt, str):
            return [await self.run(self.encode, prompt, add_special_tokens, size=len(prompt))]
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            return [await self.run(self.encode, p, add_special_tokens, size=len(p)) for p in prompt]
        if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            return [self.check_ids(p) for p in prompt]
        if isinstance(prompt, list) and prompt:
            return [self.check_ids(prompt)]
        raise RenderError("`prompt` must be a non-empty string, list of strings, or list of token ids")

    async def messages_ids(self, messages: Any, **kw: Any) -> list[int]:
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RenderError("`messages` must be a non-empty list of message objects")
        kwargs = kw.get("chat_template_kwargs")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise RenderError("`chat_template_kwargs` must be an object")
        for m in messages:
            if not isinstance(m.get("role"), str):
                raise RenderError("every message needs a string `role`")
        size = sum(len(str(m.get("content", ""))) for m in messages)
        return await self.run(self.chat_ids, messages, size=size, **kw)

    async def run(self, fn: Any, *args: Any, size: int = 0, **kw: Any) -> Any:
        """Small inputs inline; big ones, or any while another thread holds the tokenizer, in a worker thread
        (HF fast tokenizers must not be entered concurrently, so all calls hold `self.lock`)."""
        if size <= THREAD_THRESHOLD_CHARS and self.lock.acquire(blocking=False):
            try:
                return fn(*args, **kw)
            finally:
                self.lock.release()
        return await asyncio.to_thread(self._locked, fn, *args, **kw)

    def _locked(self, fn: Any, *args: Any, **kw: Any) -> Any:
        with self.lock:
            return fn(*args, **kw)


def _flatten(message: dict[str, Any]) -> dict[str, Any]:
    """OpenAI content parts (`[{"type": "text", "text": ...}]`) become one string, as vLLM's text-only path."""
    content = message.get("content")
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return {**message, "content": "\n".join(texts)}
    if content is None:
        return {**message, "content": ""}
    if not isinstance(content, str):
        raise RenderError("message `content` must be a string or a list of content parts")
    return message
