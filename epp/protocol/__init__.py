"""OpenAI request/response handling for the ext_proc server: parsing, usage, model-name rewrites."""
