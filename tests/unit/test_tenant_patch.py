"""fairq.validation.tenant_patch: the one check of a tenant settings change, for every surface."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairq import validation as v
from fairq.errors import InvalidInput


def test_only_the_named_fields_are_in_the_patch() -> None:
    p = v.tenant_patch("acme", {"max_running": "3", "rate": "unlimited"}, text=True)
    assert p.fields == {"max_running", "rate"} and p.max_running == 3 and p.rate is None
    assert not p.sets("weight")
    g = v.tenant_patch("acme", {"group": "default"})
    assert g.fields == {"group"} and g.group is None


@pytest.mark.parametrize("values,message", [
    ({"weight": 2, "burst": 7, "group": "e", "bogus": 1}, "unknown tenant setting(s) 'bogus'"),
    ({}, "give at least one of"),
    ({"rate": None, "burst": 3}, "burst needs a rate"),
    ({"rate": 5, "burst": None}, "burst must be"),
    ({"weight": "2"}, "weight must be a number"),  # not text: a string is not a number
    ({"weight": True}, "weight must be a number"),
    ({"max_running": 1.5}, "max_running must be an integer"),
    ({"group": "x" * 201}, "the limit is 200"),
])
def test_bad_patches_are_one_line(values: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        v.tenant_patch("acme", values)
    assert message in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("text", ["5_0", "\u0661\u0662", "nan", "inf", "-inf", "1e", "0x10",
                                  "2,5", " ", "", "1 000", "\uff15", "+-1"])
def test_typed_numbers_are_ascii_decimals_only(text: str) -> None:
    with pytest.raises(InvalidInput):
        v.tenant_patch("acme", {"weight": text}, text=True)


@given(st.floats(min_value=v.MIN_WEIGHT, max_value=v.MAX_WEIGHT))
def test_every_weight_python_prints_is_read_back(w: float) -> None:
    assert v.tenant_patch("acme", {"weight": repr(w)}, text=True).weight == w


@given(st.integers(min_value=0, max_value=1_000_000))
def test_every_cap_is_read_back(m: int) -> None:
    assert v.tenant_patch("acme", {"max_running": str(m)}, text=True).max_running == m
