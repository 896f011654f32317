"""by-label and the role filters (prefill/decode/encode) against GIE/llm-d behaviour."""

from __future__ import annotations

import pytest

from epp.framework import PluginConfigError
from epp.plugins.filters.by_label import ByLabelFilter
from epp.plugins.filters.decode_filter import DecodeFilter
from epp.plugins.filters.prefill_filter import PrefillFilter
from tests.helpers import build
from tests.plugins.support_pickers_filters import R, S, labeled


def test_by_label_and_role_filters() -> None:
    e = labeled([{"llm-d.ai/role": "decode"}, {"llm-d.ai/role": "prefill"}, {}, {"llm-d.ai/role": "both"}])
    assert DecodeFilter("d").filter(S, R, e) == [e[0], e[2], e[3]]
    assert PrefillFilter("p").filter(S, R, e) == [e[1], e[3]]
    f = build(ByLabelFilter, {"label": "llm-d.ai/role", "validValues": ["prefill"], "allowsNoLabel": True})
    assert f.filter(S, R, e) == [e[1], e[2]]
    with pytest.raises(PluginConfigError, match="label"):
        build(ByLabelFilter, name="b", parameters={"validValues": ["x"]})
