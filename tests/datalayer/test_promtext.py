"""Prometheus text reading: exact family names and labels, one group of lines per family."""

from __future__ import annotations

from epp.datalayer.promtext import find_family
from tests.datalayer.support_metrics import vllm_page


def test_find_family_exact_names_and_labels() -> None:
    page = vllm_page(3, 2, 0.25)
    assert find_family(page, "vllm:num_requests_waiting") == [
        ({"engine": "0", "model_name": "Qwen/Qwen2.5-0.5B-Instruct"}, 3.0)
    ]
    assert find_family(page, "vllm:num_requests") == []
    assert len(find_family(page, "vllm:time_to_first_token_seconds_bucket")) == 6
    assert find_family('x{a="q\\"}"} 1\n', "x") == [({"a": 'q"}'}, 1.0)]


def test_find_family_reads_one_group_of_lines_and_skips_prefix_sharing_families() -> None:
    """A family's samples are one group of lines (the text format requires it): all of them are read, a family
    whose name extends it (before or after the group) is not, and the scan ends with the group."""
    from epp.datalayer.promtext import find_family

    page = (
        '# HELP foo_bucket x\nfoo_bucket{le="1"} 7\nfoo_bucketx 8\n'
        '# HELP foo f\n# TYPE foo gauge\nfoo{a="1"} 1\nfoo{a="2"} 2\nfoo 3\n'
        "foo_total 4\nbar 5\n"
    )
    assert find_family(page, "foo") == [({"a": "1"}, 1.0), ({"a": "2"}, 2.0), ({}, 3.0)]
    assert find_family(page, "foo_bucket") == [({"le": "1"}, 7.0)]
    assert find_family(page, "bar") == [({}, 5.0)]
    assert find_family("foo 1", "foo") == [({}, 1.0)]
    assert find_family(page, "baz") == []
