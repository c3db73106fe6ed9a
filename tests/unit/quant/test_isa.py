"""The CPU tier (larql/quant/isa.py): read from the features numba compiles for, lowered on request,
never raised past what the target runs."""

from __future__ import annotations

import pytest

from larql.errors import QuantError
from larql.quant import isa


@pytest.mark.parametrize(("listed", "tier"), [
    ("+avx2,+fma,+f16c", "avx2"),
    ("+avx2,-fma", "float32"),
    ("+avx2,+fma,+avx512f,+avx512vl,+avx512vnni", "avx512vnni"),
    ("+avx2,+fma,+avx512vnni", "avx2"),  # no VL: no 256-bit VNNI forms
    ("", "float32"),  # NUMBA_CPU_NAME=generic
])
def test_tier_of_listed_features(listed: str, tier: str) -> None:
    assert isa.tier_of(isa.target_features(listed)) == tier


@pytest.mark.parametrize(("requested", "best", "no_vnni", "tier"), [
    (None, "avx512vnni", False, "avx512vnni"),
    (None, "avx512vnni", True, "avx2"),
    ("avx2", "avx512vnni", False, "avx2"),
    ("float32", "avx2", False, "float32"),
    ("avx512vnni", "avx2", False, "avx2"),  # never past what the target runs
    ("avx512vnni", "float32", False, "float32"),
])
def test_choose(requested: str | None, best: str, no_vnni: bool, tier: str) -> None:
    assert isa.choose(requested, best, no_vnni) == tier


def test_unknown_tier_is_refused() -> None:
    with pytest.raises(QuantError, match="LARQL_ISA='sse'"):
        isa.choose("sse", "avx2", False)


def test_runs_is_the_tier_and_below() -> None:
    assert isa.runs("float32") and isa.runs(isa.TIER)
    assert all(not isa.runs(t) for t in isa.TIERS[isa.TIERS.index(isa.TIER) + 1:])
