"""The decode-side routing sidecar (llm-d's pd-sidecar): runs next to the model server on a decode pod.

A request carrying `x-prefiller-host-port` (set by the EPP's disagg-profile-handler) is prefilled on that pod first
(`max_tokens` 1, `stream` false, `kv_transfer_params` asking for a remote decode), then decoded by the local engine
with the `kv_transfer_params` the prefill returned; without the header it is forwarded to the local engine as is.
With `--ec-connector` and `x-encoder-hosts-ports` (E/P/D), the multimodal items go to the encoders first
(epp/sidecar/encoder.py).
`python -m epp.sidecar` / `epp-pd-sidecar`; flags as llm-d's (`--kv-connector`, `--prefill-max-retries`,
`--enable-ssrf-protection`...).
"""
