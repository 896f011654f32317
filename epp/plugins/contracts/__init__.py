"""What plugins share with each other, and the only plugin package other plugin folders import.

A plugin that reads another plugin's data imports the contract here, never the other plugin's module: the key and
the producer it is read from (a `Feed`, resolved with `PluginContext.producer_for`), the value's type, and the few
helpers both sides must compute the same way. `make lint` enforces it (the `plugin-folders` contracts in
pyproject.toml).

- `prefix`: prefix-cache match info and the precise producer's full match
- `load`: the in-flight load producer
- `latency`: predicted TTFT/TPOT
- `multimodal`: the encoder-cache match
- `prompt`: the prompt's text and its length in tokens
- `session`: session affinity (the filter and the scorer)
- `topology`, `attribute`: endpoint proximity and numeric endpoint attributes (the filters and the scorers)
- `disagg`: P/D roles and the stage headers (profiles, pre-request handlers, producers)
- `labels`: label-selector requirements
"""
