from epp.framework import ApiKind, CycleState, Endpoint, InferenceRequest
from epp.plugins.pickers.round_robin_picker import RoundRobinPicker


def test_round_robin_rotates_by_name_and_returns_fallbacks() -> None:
    eps = [Endpoint(n, "10.0.0.1", p) for n, p in (("b", 2), ("a", 1), ("c", 3))]
    scored = [(e, 0.0) for e in eps]
    req = InferenceRequest(
        request_id="r", path="/v1/completions", api=ApiKind.COMPLETIONS, model="m", target_model="m", body={}
    )
    picker = RoundRobinPicker(max_num=1)
    assert [picker.pick(CycleState(), req, scored).targets[0].name for _ in range(4)] == ["a", "b", "c", "a"]
    two = RoundRobinPicker(max_num=2).pick(CycleState(), req, scored)
    assert [e.name for e in two.targets] == ["a", "b"]
    assert RoundRobinPicker().pick(CycleState(), req, []).targets == []
