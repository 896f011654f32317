"""What an image chat costs the EPP: the parser's media check and the token-producer's multimodal tokenization
(data URL decode, image header, vLLM's mm hash, Qwen2-VL placeholders, chat template), per request and as the
longest wait a 1 ms ticker on the same event loop sees (what a request arriving then would wait).

Three cases per image size: a new image (decoded and hashed), a known image in a new turn (its hash remembered by
URL fingerprint; the template re-rendered), the same request again (the prompt cache). JPEG images of random pixels,
so the bytes are as large as real photos of that size.

    python -m e2e.bench.components.multimodal [--sizes 640x480,1920x1080] [--repeats 9]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from PIL import Image

from epp.plugins.parsers._media import check_media_parts
from epp.tokenization.prompt import HFBackend, PromptTokenizer
from epp.tokenization.qwen import QWEN25_VL_MODEL, qwen25_vl_tokenizer_dir


def jpeg_url(width: int, height: int, seed: int) -> tuple[str, int]:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode(), len(buf.getvalue())


async def timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """(wall seconds, longest event-loop stall seen by a 1 ms ticker) of one call."""
    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            worst = max(worst, now - last - 0.001)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.002)
    t0 = time.perf_counter()
    await fn()
    wall = time.perf_counter() - t0
    done = True
    await task
    return wall, worst


def messages(url: str, text: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}
    ]


def _cell(samples: list[tuple[float, float]]) -> str:
    wall = statistics.median(x[0] for x in samples) * 1000
    stall = statistics.median(x[1] for x in samples) * 1000
    return f"{wall:.2f} / {stall:.2f} ms"


def _parse(msgs: list[dict[str, Any]]) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        check_media_parts(msgs)

    return call


def _tokenize(tok: PromptTokenizer, msgs: list[dict[str, Any]]) -> Callable[[], Awaitable[Any]]:
    async def call() -> Any:
        return await tok.tokenize_prompt(QWEN25_VL_MODEL, messages=msgs)

    return call


async def run(sizes: list[tuple[int, int]], repeats: int) -> None:
    tok = PromptTokenizer(HFBackend({}, qwen25_vl_tokenizer_dir()))
    await tok.tokenize_prompt(QWEN25_VL_MODEL, messages=[{"role": "user", "content": "warm up"}])
    print(
        "| image | JPEG bytes | parser check | new image (wall / loop stall) | known image, new turn | same request |"
    )
    print("|---|---|---|---|---|---|")
    for w, h in sizes:
        rows: dict[str, list[tuple[float, float]]] = {"parse": [], "new": [], "known": [], "same": []}
        size = 0
        for i in range(repeats):
            url, size = jpeg_url(w, h, i)
            msgs = messages(url, f"question {os.urandom(4).hex()}")
            turn = messages(url, f"another question {i}")
            rows["parse"].append(await timed(_parse(msgs)))
            rows["new"].append(await timed(_tokenize(tok, msgs)))
            rows["known"].append(await timed(_tokenize(tok, turn)))
            rows["same"].append(await timed(_tokenize(tok, turn)))
        cells = " | ".join(_cell(rows[k]) for k in ("parse", "new", "known", "same"))
        print(f"| {w}x{h} | {size:,} | {cells} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="640x480,1920x1080")
    p.add_argument("--repeats", type=int, default=9)
    a = p.parse_args()
    sizes = [(int(x), int(y)) for x, y in (s.split("x") for s in a.sizes.split(","))]
    asyncio.run(run(sizes, a.repeats))


if __name__ == "__main__":
    main()
