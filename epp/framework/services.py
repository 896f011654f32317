"""The shared services a plugin may ask its PluginContext for, as interfaces.

The wiring layer implements them (epp.kvcache, epp.tokenization); plugins see only these Protocols, so the
plugin layer never imports the KV-event machinery or a tokenizer backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from epp.framework.params import Params, PluginConfigError
from epp.framework.types import Endpoint, PrefixMatch, TokenizedPrompt


class Tokenizer(Protocol):
    """Prompt → token ids exactly as the model server renders them. Raises TokenizationError."""

    async def tokenize(
        self,
        model: str,
        *,
        prompt: str | list[Any] | None = None,
        messages: list[dict[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Any] | None = None,
    ) -> list[int]: ...

    async def tokenize_prompt(
        self,
        model: str,
        prompt: str | list[Any] | None = None,
        messages: list[dict[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Any] | None = None,
        mm_model_id: str | None = None,
    ) -> TokenizedPrompt:
        """The token ids with multimodal placeholders expanded, and each multimodal item's vLLM mm hash and
        placeholder range (`mm_model_id`: the model vLLM hashes items with, its `--model`)."""
        ...


@dataclass(frozen=True, slots=True)
class CountedReport:
    """A response without cached_tokens, for the closed loop on delivered hits: `pod` served a `prompt`-token request
    of `blocks` index blocks (of `block_size` tokens), `predicted_blocks` of them predicted cached there;
    `engine_hits`/`engine_queries` are the pod's last scraped prefix-cache counters (None: its page has none)."""

    pod: str
    blocks: int
    predicted_blocks: int
    block_size: int
    prompt: int
    engine_hits: float | None
    engine_queries: float | None


class SpeculationHold:
    """Keeps a pick's speculative index entries past their TTL while its prefill may still be queued behind others:
    until the pod's KV events hold the blocks or the request ends (then `ttl` more), at most `cap` seconds from the
    pick. A fixed TTL shorter than the queue lets the next request of the prefix go elsewhere and compute it twice."""

    __slots__ = ("deadline", "ended", "ttl")

    def __init__(self, ttl: float, cap: float, now: float) -> None:
        self.ttl = ttl
        self.deadline = now + cap
        self.ended: float | None = None

    def end(self, now: float) -> None:
        if self.ended is None:
            self.ended = now

    def until(self, now: float) -> float:
        """The entries' expiry as seen at `now` (not after it: they may go)."""
        return min(self.deadline, (now if self.ended is None else self.ended) + self.ttl)


class KVCacheIndex(Protocol):
    """Which endpoint holds which KV blocks of a prompt, fed by the engines' KV events. Endpoints by hostport."""

    def block_size_for(self, model: str, endpoints: Sequence[Endpoint] = ()) -> int | None: ...

    def request_keys(
        self,
        tokens: Sequence[int],
        model: str,
        endpoints: Sequence[Endpoint] = (),
        cache_salt: str | None = None,
        mm_items: Sequence[tuple[str, int, int]] = (),
    ) -> list[int]:
        """Block keys of `tokens`; `mm_items` (identifier, offset, length) go into the extra keys of the blocks
        their placeholders overlap, as vLLM's block hashes carry them."""
        ...

    async def match(self, keys: Sequence[int], pods: Iterable[str] | None = None) -> Mapping[str, PrefixMatch]: ...

    def publishes(self, pod: str) -> bool:
        """Whether `pod`'s KV events have stored blocks in the index since it joined the pool (a pod that publishes
        none, or whose events are not received, is known only from what the EPP routed there)."""
        ...

    def speculate(self, keys: Sequence[int], pod: str, ttl: float, hold: SpeculationHold | None = None) -> None: ...

    def speculative_only(self, pod: str, key: int) -> bool:
        """Whether `pod` holds block `key` only through a live speculative entry (no event of its put it there)."""
        ...

    def report_delivered(
        self, pod: str, keys: Sequence[int], predicted_blocks: int, delivered_tokens: int, block_size: int, prompt: int
    ) -> None:
        """The closed loop: `pod` served a request whose `keys` the index matched for `predicted_blocks` there, and
        the engine reported `delivered_tokens` cached of `prompt`. Repairs the pod's entries when they are wrong."""
        ...

    def report_counted(self, report: CountedReport) -> None:
        """The closed loop for a response without cached_tokens: the engine's counters, compared per scrape
        interval with what the index predicted for the requests routed to the pod."""
        ...


class Services(Protocol):
    """Factories for the shared services, configured from the asking plugin's parameters."""

    def tokenizer(self, params: Params) -> Tokenizer:
        """A tokenizer from `tokenizer: {type: hf|vllm, ...}` (or those keys at the top level of `params`)."""
        ...

    def kv_cache(self, params: Params) -> KVCacheIndex:
        """The EPP's one KV-block index (the first caller's `tokenProcessorConfig`/`indexerConfig`/
        `kvEventsConfig` configure it; later callers share it)."""
        ...


class NoServices:
    """A context without the EPP's services (unit tests of plugins that need none)."""

    def tokenizer(self, params: Params) -> Tokenizer:
        raise PluginConfigError(f"{params.plugin}: no tokenizer service in this context")

    def kv_cache(self, params: Params) -> KVCacheIndex:
        raise PluginConfigError(f"{params.plugin}: no KV-cache service in this context")
