"""What every stream shares (`ServerState`: the body-less pick, the parse thread) and what one stream holds
(`StreamState`: its modes from the server's defaults, the API's error shape known before the body is parsed)."""

from __future__ import annotations

import threading

import pytest

from epp.framework.errors import DROPPED_NO_ENDPOINTS, ServiceUnavailable
from epp.framework.parsing import ParserRegistry
from epp.plugins.parsers.vllmgrpc_parser import VLLMGRPCParser
from epp.server.stages.state import BUFFERED, FULL_DUPLEX, RECEIVED, StreamState
from tests.server.support import stream_state


def test_bodyless_picks_go_round_robin_within_the_subset() -> None:
    state = stream_state()  # endpoints 10.0.0.1:8000 and 10.0.0.2:8000
    picks = [state.pick_bodyless(None).destination for _ in range(4)]
    assert picks[0] != picks[1] and picks[:2] == picks[2:]
    assert set(picks) == {"10.0.0.1:8000", "10.0.0.2:8000"}
    assert {state.pick_bodyless(["10.0.0.1"]).destination for _ in range(3)} == {"10.0.0.1:8000"}
    with pytest.raises(ServiceUnavailable) as e:
        state.pick_bodyless(["10.9.9.9:1"])
    assert e.value.dropped_reason == DROPPED_NO_ENDPOINTS


def test_one_parse_thread_is_made_on_first_use_and_kept() -> None:
    state = stream_state()
    assert state._parse_pool is None  # a server that never sees a large body starts no thread
    pool = state.parse_pool()
    assert state.parse_pool() is pool
    name = pool.submit(lambda: threading.current_thread().name).result(5)
    assert name.startswith("epp-parse")
    assert pool._max_workers == 1
    pool.shutdown()


def test_a_stream_starts_in_the_servers_modes() -> None:
    state = stream_state(request_body_mode=BUFFERED)
    s = StreamState(state)
    assert (s.state, s.request_mode, s.response_mode) == (RECEIVED, BUFFERED, FULL_DUPLEX)
    assert s.request is None and s.decision is None and not s.model_routed and not s.defer_completion


@pytest.mark.parametrize(
    ("path", "shape"),
    [("/v1/messages", "anthropic"), ("/v1/chat/completions", "openai"), ("/v1/messages?beta=true", "anthropic")],
)
def test_the_error_shape_is_the_paths_parsers_before_any_body(path: str, shape: str) -> None:
    s = StreamState(stream_state())
    s.headers = {":path": path, "x-request-id": "rid-9"}
    assert s._format() == shape
    assert s._request_id() == "rid-9"


def test_a_path_no_parser_claims_gets_openais_shape() -> None:
    state = stream_state()
    state.parsers = ParserRegistry([VLLMGRPCParser()])
    s = StreamState(state)
    s.headers = {":path": "/v1/completions"}
    assert s._format() == "openai"
    s = StreamState(state)
    s.headers = {":path": "/vllm.grpc.engine.VllmEngine/Generate"}
    assert s._format() == "grpc"
    assert s._request_id() == "?"
