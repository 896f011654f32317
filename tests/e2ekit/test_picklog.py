"""Pick logs: access-log lines and both EPPs' score lines read into picks, and two EPPs' picks compared (ties
excepted, what decided each difference)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e.harness.picklog import (
    Pick,
    attach_terms,
    compare,
    decided_by,
    discovery_names,
    from_access_log,
    main,
    read,
    terms_from_log,
    write,
)

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"


def test_access_log_lines_become_picks_in_replay_order(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    lines = [
        {"replay": "1", "request_id": "r1", "pick": B, "scores": {A: 0.5, B: 1.5}, "upstream": B, "status": 200},
        {"replay": None, "request_id": "w", "pick": A, "scores": None, "upstream": A, "status": 200},  # a warm-up
        {"replay": "0", "request_id": "r0", "pick": None, "scores": None, "upstream": A, "status": 200},
        {"replay": "2", "request_id": "r2", "pick": f"{C},{A}", "scores": None, "upstream": "-", "status": 503},
    ]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    picks = from_access_log(log)
    assert [(p.replay, p.request_id, p.pod, p.status) for p in picks] == [
        (0, "r0", A, 200),  # no metadata (an EPP without it): the pod Envoy sent it to
        (1, "r1", B, 200),
        (2, "r2", C, 503),  # a fallback list: its first endpoint is the pick
    ]
    assert picks[1].scores == {A: 0.5, B: 1.5}
    log.write_text("not json\n")
    with pytest.raises(ValueError, match=r"access\.log:1"):
        from_access_log(log)


def test_llm_d_score_lines_and_pyepp_pick_lines_become_terms(tmp_path: Path) -> None:
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(
        "endpoints:\n- {name: vllm-0, address: 10.0.0.1, port: '8000'}\n"
        "- {name: vllm-1, namespace: inf, address: 10.0.0.2, port: '8000'}\n"
    )
    names = discovery_names(endpoints)
    assert names == {"vllm-0": A, "vllm-1": B, "inf/vllm-1": B}
    log = tmp_path / "epp.log"
    calc = {"level": "debug", "msg": "Calculated score", "x-request-id": "r1", "plugin": "tl/token-load-scorer"}
    log.write_text(
        "\n".join(
            [
                json.dumps({**calc, "endpoint": {"name": "vllm-0", "namespace": "default"}, "score": 0.25}),
                json.dumps({**calc, "endpoint": {"name": "vllm-1", "namespace": "inf"}, "score": 1}),
                json.dumps({**calc, "endpoint": "default/vllm-0", "score": 0.5, "x-request-id": "r2"}),
                json.dumps({"level": "info", "msg": "EPP received request", "x-request-id": "r1"}),
                # pyepp, JSON and text logs
                json.dumps(
                    {
                        "level": "debug",
                        "msg": f"pick request=p1 profile=default picked={A} scores="
                        f"{{'{A}': {{'queue-scorer*1': 1.0, 'total': 1.0}}, '{B}': {{'queue-scorer*1': 0.5, "
                        f"'total': 0.5}}}}",
                    }
                ),
                f"DEBUG pick request=p2 profile=default picked={B} scores={{'{B}': {{'a*2': 0.1, 'total': 0.2}}}}",
                f"DEBUG pick request=p2 profile=prefill picked={A} scores={{'{A}': {{'b*1': 1.0, 'total': 1.0}}}}",
            ]
        )
        + "\n"
    )
    terms = terms_from_log(log, names)
    assert terms["r1"] == {"tl/token-load-scorer": {A: 0.25, B: 1.0}}
    assert terms["r2"] == {"tl/token-load-scorer": {A: 0.5}}
    assert terms["p1"] == {"queue-scorer*1": {A: 1.0, B: 0.5}}
    assert terms["p2"] == {"a*2": {B: 0.1}}  # the primary profile's, not the prefill one's
    picks = [Pick(0, "p1", A), Pick(1, "nope", B)]
    assert attach_terms(picks, terms) == 1 and picks[0].terms and not picks[1].terms


def test_ties_are_excepted_and_the_run_of_agreement_stops_at_the_first_difference() -> None:
    a = [
        Pick(0, "a0", A, {A: 2.0, B: 1.0}),
        Pick(1, "a1", A, {A: 1.0, B: 1.0}),  # a tie: either pick is the EPP's
        Pick(2, "a2", A, {A: 2.0, B: 1.0}),
        Pick(3, "a3", B, {A: 1.0, B: 2.0}),
        Pick(4, "a4", A, {A: 1.0}),  # b has no pick for it
    ]
    b = [
        Pick(0, "b0", A, {A: 1.5, B: 1.0}),
        Pick(1, "b1", B, {A: 0.5, B: 1.0}),
        Pick(2, "b2", B, {A: 0.5, B: 1.0}),
        Pick(3, "b3", B, {A: 0.5, B: 1.0}),
    ]
    c = compare(a, b, rename=False)
    assert (c.matched, c.same, c.ties, c.differ, c.prefix) == (4, 2, 1, 1, 1)
    assert c.agreement == pytest.approx(2 / 3)
    assert dict(c.decided_by) == {"scores": 1}
    text = "\n".join(c.lines())
    assert "agreement (ties excepted): 66.7%" in text and "decided by scores: 1" in text


def test_picks_are_compared_up_to_a_renaming_of_pods_neither_run_had_used() -> None:
    # a first tie broken towards another idle pod, then each run stays on its pod: the same routing
    a = [Pick(0, "", A, {A: 1.0, B: 1.0, C: 1.0}), Pick(1, "", A, {A: 1.0}), Pick(2, "", B, {B: 1.0, C: 1.0})]
    b = [Pick(0, "", B, {A: 1.0, B: 1.0, C: 1.0}), Pick(1, "", B, {B: 1.0}), Pick(2, "", C, {A: 1.0, C: 1.0})]
    strict = compare(a, b, rename=False)
    assert (strict.same, strict.ties, strict.differ) == (0, 2, 1)
    c = compare(a, b)
    assert (c.same, c.ties, c.differ, c.prefix) == (3, 0, 0, 3)  # A is B's B; B (unused in a) is B's C (unused)
    # a pod one run had used is not renamed: B back on its first pod while A takes an idle one is a difference,
    # judged with B's pods named as A's (B's B is A's A: a's pick C was not among b's candidates)
    b2 = [Pick(0, "", B, {A: 1.0, B: 1.0, C: 1.0}), Pick(1, "", B, {B: 1.0}), Pick(2, "", B, {B: 2.0, C: 1.0})]
    a[2].scores = {B: 1.0, C: 0.5}
    c = compare(a, b2)
    assert (c.same, c.differ, c.prefix, dict(c.decided_by)) == (2, 1, 2, {"filter": 1})
    assert "pods renamed" in "\n".join(c.lines())


def test_what_decided_a_difference() -> None:
    # the filters left other candidates: b's pick was filtered out by a
    assert decided_by(Pick(0, "", A, {A: 1.0}), Pick(0, "", B, {A: 0.5, B: 1.0})) == "filter"
    # both logged terms: the term whose preference between the two picks differs most between the EPPs
    a = Pick(0, "", A, {A: 2.0, B: 1.5}, {"prefix*1": {A: 1.0, B: 0.0}, "queue*1": {A: 0.0, B: 0.5}})
    b = Pick(0, "", B, {A: 1.2, B: 1.5}, {"prefix*1": {A: 1.0, B: 0.0}, "queue*1": {A: 0.2, B: 1.5}})
    assert decided_by(a, b) == "term queue*1"
    # the same plugin types under each EPP's naming (pyepp name*weight, llm-d name/type)
    a = Pick(0, "", A, {}, {"token-load-scorer*1": {A: 1.0, B: 0.2}})
    b = Pick(0, "", B, {}, {"x/token-load-scorer": {A: 0.1, B: 0.9}})
    assert decided_by(a, b) == "term token-load-scorer*1"
    # one side's terms only: the term that favoured its pick the most
    a = Pick(0, "", A, {A: 1.0, B: 0.9}, {"p*1": {A: 0.6, B: 0.0}, "q*1": {A: 0.4, B: 0.9}})
    assert decided_by(a, Pick(0, "", B, {A: 0.1, B: 1.0})) == "term p*1 (A only)"
    assert decided_by(Pick(0, "", A), Pick(0, "", B)) == "unknown"


def test_the_cli_converts_and_compares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "access.log"
    log.write_text(json.dumps({"replay": "0", "request_id": "r", "pick": A, "scores": {A: 1, B: 0}}) + "\n")
    epp_log = tmp_path / "epp.log"
    epp_log.write_text(f"pick request=r profile=default picked={A} scores={{'{A}': {{'q*1': 1.0, 'total': 1.0}}}}\n")
    out = tmp_path / "a.jsonl"
    assert main(["convert", str(log), "--epp-log", str(epp_log), "-o", str(out)]) == 0
    assert "1 picks (1 with per-scorer terms)" in capsys.readouterr().out
    assert read(out)[0].terms == {"q*1": {A: 1.0}}
    other = tmp_path / "b.jsonl"
    write(other, [Pick(0, "x", B, {A: 0.0, B: 1.0})])
    assert main(["compare", str(out), str(other), "--strict"]) == 0
    assert "different: 1" in capsys.readouterr().out
    assert main(["compare", str(out), str(other)]) == 0  # two idle pods: the same pick up to renaming
    assert "identical: 1" in capsys.readouterr().out
    (tmp_path / "bad.jsonl").write_text('{"replay": 0}\n')
    assert main(["compare", str(out), str(tmp_path / "bad.jsonl")]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
