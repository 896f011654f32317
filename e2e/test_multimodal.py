"""Multimodal chat through Envoy + EPP to Qwen2.5-VL-like simulators (`--multimodal`) publishing KV events.

The EPP tokenizes image chats locally (placeholders expanded, each image hashed as vLLM hashes it) and puts the mm
hashes into the block keys' extra keys; the simulators' BlockStored events carry theirs. So the second turn of an
image chat goes to the pod that caches it and reuses the prefix through the image, while the same text with a
different image reuses nothing past the image's first block. `mm-embeddings-cache-scorer` alone keeps an image on the
pod that encoded it. Malformed image parts get a 400 in the API's error shape (from the EPP's parser, or, for parts
only loading reveals, from the model server), never a 500 or a hang.
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from e2e.harness.http import post_json
from e2e.harness.simconfig import sim_endpoints_yaml
from e2e.harness.stack import Stack, start_stack
from e2e.sim.launch import SimProcess, start_simulators
from epp.tokenization.qwen import QWEN25_VL_MODEL, qwen25_vl_tokenizer_dir

pytestmark = pytest.mark.e2e

BS = 16
PAD = 151655  # <|image_pad|>
SYSTEM = "You describe product photos for a catalogue. " + " ".join(
    f"Rule {i}: name the colour, the shape and the material in under forty words." for i in range(30)
)


def image(color: tuple[int, int, int], size: tuple[int, int] = (448, 336)) -> str:
    img = Image.new("RGB", size, color)
    for x in range(0, size[0], 7):  # some structure, so PNG bytes differ per colour
        img.putpixel((x, x % size[1]), (x % 256, 0, 255 - x % 256))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


SHORT = "Describe."
RED, BLUE = image((200, 20, 20)), image((20, 20, 200))
IMAGE_TOKENS = (448 // 28) * (336 // 28)  # 192: smart_resize keeps 448x336 (multiples of 28 within the bounds)


def config(sims: list[SimProcess], scorer: str = "precise-prefix-cache-scorer", tokenizer: str = "") -> str:
    tokenizer = tokenizer or (
        f"{{tokenizer: {{type: hf, dir: '{qwen25_vl_tokenizer_dir()}'}}, modelName: '{QWEN25_VL_MODEL}'}}"
    )
    scorer_params = (
        "    parameters:\n      tokenProcessorConfig: {blockSize: 16, hashSeed: '3'}\n"
        "      kvEventsConfig: {topicFilter: 'kv@', concurrency: 2}\n"
        if scorer == "precise-prefix-cache-scorer"
        else ""
    )
    lines = [
        "plugins:",
        f"  - type: token-producer\n    parameters: {tokenizer}",
        f"  - type: {scorer}\n{scorer_params}".rstrip("\n"),
        "  - type: max-score-picker",
        "schedulingProfiles:",
        "  - name: default",
        f"    plugins: [{{pluginRef: {scorer}, weight: 1}}, {{pluginRef: max-score-picker}}]",
    ]
    if scorer != "precise-prefix-cache-scorer":
        lines.insert(3, "  - type: mm-embeddings-cache-producer")
    return "\n".join(lines) + "\n" + sim_endpoints_yaml(sims)


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimProcess]]:
    qwen25_vl_tokenizer_dir()  # built once, before the processes that load it
    args = ["--block-size", str(BS), "--model", QWEN25_VL_MODEL, "--multimodal"]
    with start_simulators(4, base_args=args, timeout=180) as s:
        yield s


@pytest.fixture
def stack(tmp_path: Path, sims: list[SimProcess]) -> Iterator[Stack]:
    for sim in sims:  # each test starts from empty caches
        post_json(f"http://{sim.host}:{sim.http_port}/reset_prefix_cache", {})
    s = start_stack(tmp_path, backends=[], config=config(sims))
    yield s
    s.close()


def user(text: str, img: str | None = None) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if img is not None:
        parts.insert(0, {"type": "image_url", "image_url": {"url": img}})
    return {"role": "user", "content": parts}


def chat(*messages: dict[str, Any], system: str = SYSTEM) -> dict[str, Any]:
    return {"model": QWEN25_VL_MODEL, "max_tokens": 2, "messages": [{"role": "system", "content": system}, *messages]}


def served(r: Any) -> tuple[int, int, int]:
    """(pod port, prompt tokens, cached tokens) of a 200."""
    assert r.status == 200, r.body
    usage = r.json()["usage"]
    return int(r.headers["x-inference-port"]), usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def render(sims: list[SimProcess], body: dict[str, Any]) -> dict[str, Any]:
    """The simulator's own rendering of `body` (vLLM's /v1/chat/completions/render: ids and mm features)."""
    s = sims[0]
    r = post_json(f"http://{s.host}:{s.http_port}/v1/chat/completions/render", body)
    assert r.status == 200, r.body
    return dict(r.json())


def test_image_chat_second_turn_hits_its_cached_prefix_and_a_different_image_does_not(
    stack: Stack, sims: list[SimProcess]
) -> None:
    # The image starts in block 0 (a short system prompt): every block of the prompt carries its mm hash, so the EPP
    # matches nothing at all unless its block keys carry the same mm hashes as the simulators' events.
    turn1 = chat(user("What is this?", RED), system=SHORT)
    rendered = render(sims, turn1)
    (offset,) = [p["offset"] for p in rendered["features"]["mm_placeholders"]["image"]]
    (length,) = [p["length"] for p in rendered["features"]["mm_placeholders"]["image"]]
    assert length == IMAGE_TOKENS and rendered["token_ids"][offset : offset + length] == [PAD] * length
    assert offset < BS
    first, prompt1, cached1 = served(post_json(stack.url + "/v1/chat/completions", turn1))
    assert prompt1 == len(rendered["token_ids"]) and cached1 == 0
    time.sleep(0.3)  # turn 1's KV events reach the EPP
    history = [user("What is this?", RED), {"role": "assistant", "content": "A red square."}]
    for i in range(3):  # four pods and rotating ties: chance alone would rarely keep every turn on the first pod
        body = chat(*history, user(f"Question {i}: is it matte or glossy?"), system=SHORT)
        port, _, cached = served(post_json(stack.url + "/v1/chat/completions", body))
        assert port == first, f"turn {i + 2} left the pod caching the image chat"
        assert cached >= (offset + length) // BS * BS  # the prefix through the image was reused
        history += [body["messages"][-1], {"role": "assistant", "content": f"Answer {i}."}]
        time.sleep(0.2)
    # The same text with a different image: nothing is reused, on whichever pod (no block before the image).
    blue = chat(user("What is this?", BLUE), system=SHORT)
    _, _, cached = served(post_json(stack.url + "/v1/chat/completions", blue))
    assert cached == 0
    time.sleep(0.3)
    # With a long text before the image, the same text and a different image share exactly the blocks before it.
    long_red = chat(user("What is this?", RED))
    (offset,) = [p["offset"] for p in render(sims, long_red)["features"]["mm_placeholders"]["image"]]
    first, _, _ = served(post_json(stack.url + "/v1/chat/completions", long_red))
    time.sleep(0.3)
    port, _, cached = served(post_json(stack.url + "/v1/chat/completions", chat(user("What is this?", BLUE))))
    assert port == first  # the EPP follows the shared text prefix
    assert cached == offset // BS * BS  # and nothing from the block holding the image's first placeholder on


def test_render_backend_features_key_the_blocks_too(tmp_path: Path, sims: list[SimProcess]) -> None:
    """token-producer on the model server's render API (llm-d's `vllm` backend): the render response's `features`
    (mm hashes, placeholder ranges) go into the block keys, so a later turn follows the image chat's pod."""
    for sim in sims:
        post_json(f"http://{sim.host}:{sim.http_port}/reset_prefix_cache", {})
    render_url = f"http://{sims[0].host}:{sims[0].http_port}"
    s = start_stack(tmp_path, backends=[], config=config(sims, tokenizer=f"{{vllm: {{url: '{render_url}'}}}}"))
    try:
        green = image((20, 200, 20))
        first, _, _ = served(post_json(s.url + "/v1/chat/completions", chat(user("What?", green), system=SHORT)))
        time.sleep(0.3)
        history = [user("What?", green), {"role": "assistant", "content": "Green."}]
        for i in range(3):
            body = chat(*history, user(f"And {i}?"), system=SHORT)
            port, _, cached = served(post_json(s.url + "/v1/chat/completions", body))
            assert port == first and cached >= IMAGE_TOKENS
            history += [body["messages"][-1], {"role": "assistant", "content": "Yes."}]
            time.sleep(0.2)
    finally:
        s.close()


def test_encoder_cache_affinity_keeps_an_image_on_the_pod_that_encoded_it(
    tmp_path: Path, sims: list[SimProcess]
) -> None:
    """mm-embeddings-cache-scorer alone: requests sharing no text prefix follow their image."""
    s = start_stack(tmp_path, backends=[], config=config(sims, scorer="mm-embeddings-cache-scorer"))
    try:
        first, _, _ = served(post_json(s.url + "/v1/chat/completions", chat(user("Colour?", RED), system="A")))
        for i in range(3):
            body = chat(user(f"Describe item {i}.", RED), system=f"Catalogue {i} assistant.")
            port, _, _ = served(post_json(s.url + "/v1/chat/completions", body))
            assert port == first
        # new images: nobody encoded them, so the ties rotate over the pods; each then sticks to its pod
        firsts = []
        for k, img in enumerate(image((40 * k, 250 - 40 * k, 90)) for k in range(4)):
            pod, _, _ = served(post_json(s.url + "/v1/chat/completions", chat(user("Colour?", img), system=f"B{k}")))
            again, _, _ = served(post_json(s.url + "/v1/chat/completions", chat(user("Shape?", img), system=f"C{k}")))
            assert again == pod
            firsts.append(pod)
        assert len(set(firsts)) > 1
    finally:
        s.close()


def test_malformed_image_parts_get_a_400_in_the_apis_error_shape(stack: Stack) -> None:
    def part(url: Any) -> dict[str, Any]:
        return chat({"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]})

    url = stack.url + "/v1/chat/completions"
    for bad, fragment in (
        (part("data:image/png;base64,%%%not-base64%%%"), "invalid base64"),
        (part("file:///etc/hostname"), "unsupported URL scheme"),
        (chat({"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}), "must be an object"),
    ):
        r = post_json(url, bad)
        assert r.status == 400, r.body
        err = r.json()["error"]
        assert fragment in err["message"] and err["code"] == 400
    # only loading reveals these: the EPP routes them unscored and the model server answers its own 400, promptly
    for bad, fragment in (
        (part("data:image/png;base64," + base64.b64encode(b"not an image at all").decode()), "Failed to load image"),
        (part("http://127.0.0.1:9/nothing-listens-here.png"), "Failed to fetch image"),
    ):
        t0 = time.monotonic()
        r = post_json(url, bad, timeout=40)
        assert r.status == 400, r.body
        assert fragment in r.json()["error"]["message"]
        assert time.monotonic() - t0 < 25  # no hang: under the EPP's 30 s media timeout (seconds on a loaded box)
    # Anthropic's shape on /v1/messages
    msg = {
        "model": QWEN25_VL_MODEL,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "@@"}}]}],
    }
    r = post_json(stack.url + "/v1/messages", msg)
    assert r.status == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "invalid base64" in body["error"]["message"]
