"""The EPP's shared services behind the framework's `Services` interface: the KV-block index (epp.kvcache) and
tokenizers (epp.tokenization), created on first request from the asking plugin's parameters."""

from __future__ import annotations

from epp.framework import EndpointView, KVCacheIndex, Params, Tokenizer
from epp.framework.context import BackgroundTask
from epp.kvcache.service import KVCacheService, KVCacheSettings
from epp.tokenization.factory import tokenizer_from_params
from epp.tokenization.prompt import PromptTokenizer


class EppServices:
    """One KV-cache service per EPP (its event pool follows the endpoints); one tokenizer per token producer."""

    def __init__(self, endpoints: EndpointView, background: list[BackgroundTask]) -> None:
        self._endpoints = endpoints
        self._background = background
        self.kv: KVCacheService | None = None
        self.tokenizers: list[PromptTokenizer] = []
        # Startup loads (tokenizers) the server runs at once and waits for before it reports ready: a request
        # must never be the one that loads a tokenizer, and the load must never run on the event loop.
        self.warmups: list[BackgroundTask] = []

    def tokenizer(self, params: Params) -> Tokenizer:
        tok = tokenizer_from_params(params)
        self.tokenizers.append(tok)
        self.warmups.append(tok.warm)
        return tok

    def kv_cache(self, params: Params) -> KVCacheIndex:
        settings = KVCacheSettings.from_params(params)  # every asker's parameters are checked (and read)
        if self.kv is None:
            svc = KVCacheService(settings)
            self._endpoints.subscribe(svc)  # a pod's delivered-hits windows go when it leaves
            if svc.settings.events_enabled:
                self._endpoints.subscribe(svc.pool.subscriptions)
                self._background.append(svc.pool.run)
            if svc.settings.metrics_logging_interval > 0:
                self._background.append(svc.log_index_metrics)
            self.kv = svc
        return self.kv
