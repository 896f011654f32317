"""A request for a model whose tokenizer was not preloaded must not load it on the event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from epp.tokenization.prompt import HFBackend
from epp.tokenization.qwen import qwen25_tokenizer_dir


async def test_first_load_runs_on_the_tokenizer_thread(monkeypatch: Any) -> None:
    loads: list[str] = []
    real = HFBackend._load

    def spy(d: str, model: str) -> Any:
        loads.append(threading.current_thread().name)
        return real(d, model)

    monkeypatch.setattr(HFBackend, "_load", staticmethod(spy))
    backend = HFBackend({"m": qwen25_tokenizer_dir()})
    ids = await backend.completion("m", "hello world")
    assert ids
    assert loads and all(name.startswith("tokenize") for name in loads), loads
    # the loop stays responsive while a second model's first load is in flight
    backend2 = HFBackend({"m2": qwen25_tokenizer_dir()})
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    t = asyncio.create_task(tick())
    await backend2.chat("m2", [{"role": "user", "content": "hi"}], {})
    t.cancel()
    assert ticks > 0
    assert loads[-1].startswith("tokenize")
