"""Tokenization: local Hugging Face tokenizers (and the Qwen2.5 builder used by tests, the demo and the simulator)."""
