"""The ext_proc request path as stages, each a class that extends the one before it, in the order a request
meets them: `state` (what one stream holds and what every stream shares), `receive` (headers, body budgeting
and the body deadline), `parse` (the body into an `InferenceRequest`, large ones off the loop), `decide` (the
director's call), `answer` (immediate responses, the destination header and `envoy.lb` metadata) and `response`
(status, usage, model-name rewrite, eviction, completion). `epp.server.extproc.RequestStream` is the last one and
dispatches each ext_proc message to them; the servicer there owns when deferred work runs (after each answer
is written)."""
