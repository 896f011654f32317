"""token-producer (llm-d; formerly `tokenizer`): the prompt's token ids, exactly as the model server renders them.

Writes TOKENIZED_PROMPT for the plugins that consume it (the precise prefix-cache producer). The tokenizer comes
from the EPP's services, configured by `tokenizer: {type: hf|vllm, ...}`, llm-d's `vllm: {url}` or its deprecated
`udsTokenizerConfig` (the gRPC sidecar, epp/tokenization/uds.py); a request that
cannot be tokenized is logged and scheduled without token data. llm-d's `estimate: {image, video}` selects the
tokenizer-free backend instead (epp/plugins/producers/_estimate.py: 4 bytes a pseudo token, multimodal placeholder
estimates); it excludes `vllm`, `modelName` and `udsTokenizerConfig`, as llm-d's does.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any, Self

from epp.framework import (
    TOKENIZED_PROMPT,
    DataKey,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
    TokenizationError,
    TokenizedPrompt,
    Tokenizer,
)
from epp.framework.verbosity import VERBOSE, V
from epp.plugins.producers._estimate import EstimateBackend, estimators_from_params

log = logging.getLogger(__name__)
_MM_KWARGS = ("mm_processor_kwargs", "media_io_kwargs")


class TokenProducer(Plugin):
    type_name = "token-producer"
    aliases = ("tokenizer",)

    def __init__(
        self,
        name: str,
        tokenizer: Tokenizer | None,
        model_name: str | None = None,
        estimator: EstimateBackend | None = None,
    ) -> None:
        super().__init__(name)
        if tokenizer is None and estimator is None:
            raise ValueError("token-producer needs a tokenizer or the estimate backend")
        self.tokenizer = tokenizer
        self.estimator = estimator
        # llm-d's `modelName`: the model whose tokenizer is used (sent in render requests), whatever the request's.
        self.model_name = model_name

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        if params.has("estimate"):
            if params.has("vllm") or params.has("modelName") or params.has("udsTokenizerConfig"):
                raise params.fail(
                    "estimate", "only one of 'estimate', 'vllm' (or 'modelName') and 'udsTokenizerConfig' may be set"
                )
            image, video = estimators_from_params(params.section("estimate"))
            return cls(name, None, estimator=EstimateBackend(image, video))
        model_name = params.optional_str("modelName") or None
        return cls(name, context.services.tokenizer(params), model_name)

    def produces(self) -> Collection[DataKey[Any]]:
        return (TOKENIZED_PROMPT,)

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        if TOKENIZED_PROMPT in request.data:
            return
        if request.token_ids is not None:  # pre-tokenized (/inference/v1/generate, SGLang, gRPC): nothing to do
            feats = sorted(request.mm_features, key=lambda f: f.offset) if request.mm_features else None
            request.data.put(TOKENIZED_PROMPT, TokenizedPrompt(list(request.token_ids), feats))
            return
        if self.estimator is not None:
            estimated = self.estimator.estimate(request)
            if estimated is not None:
                request.data.put(TOKENIZED_PROMPT, estimated)
            return
        tokenizer = self.tokenizer
        if tokenizer is None:
            return
        if request.messages is not None and any(k in request.body for k in _MM_KWARGS):
            # vLLM folds these into every item's mm hash (and the processor's placeholder count): not reproduced
            log.log(
                V(VERBOSE),
                "request %s: not tokenized, no prefix score: %s set",
                request.request_id,
                "/".join(_MM_KWARGS),
            )
            return
        try:
            prompt = await tokenizer.tokenize_prompt(
                self.model_name or request.target_model,
                prompt=request.prompt if request.messages is None else None,
                messages=request.messages,
                chat_template_kwargs=request.chat_template_kwargs,
                tools=request.tools,
                mm_model_id=self.model_name,
            )
        except TokenizationError as e:
            log.log(V(VERBOSE), "request %s: not tokenized, no prefix score: %s", request.request_id, e)
            return
        request.data.put(TOKENIZED_PROMPT, prompt)
