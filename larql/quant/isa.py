"""The CPU tier the int8 kernels are built for, chosen once at import:

    avx512vnni   vpdpbusd / vpdpwssd (AVX-512 VNNI, with AVX-512 VL for the 256-bit forms): every int8 pass
    avx2         vpmaddubsw + vpmaddwd: extraction's down_meta pass, greedy decode's tiled candidate
                 pass, the editing top-k on the tiled copy and the gate KNN; the row candidate pass
                 takes its float32 form
    float32      no int8 pass: the float32 forms, with the same answers

The tier follows the features numba compiles for: this CPU's, or the ones `NUMBA_CPU_FEATURES`
lists (`NUMBA_CPU_NAME` alone changes only the instruction scheduling: numba keeps this CPU's
features; an AVX2 build on a newer CPU is `NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=+avx2,+fma,...`,
and `NUMBA_CPU_NAME=generic` has no features). `LARQL_ISA` names a lower tier, to measure or test it
on a newer CPU; a tier the target cannot run gives way to the best one below it that it can.
`LARQL_NO_VNNI` caps the tier at avx2.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from larql.errors import QuantError

TIERS = ("float32", "avx2", "avx512vnni")  # lowest first


def tier_of(features: Mapping[str, bool]) -> str:
    """The highest tier a CPU with these features runs."""
    if features.get("avx512vnni") and features.get("avx512vl"):
        return "avx512vnni"
    return "avx2" if features.get("avx2") and features.get("fma") else "float32"


def target_features(listed: str | None) -> Mapping[str, bool]:
    """The features numba compiles for: `listed` (NUMBA_CPU_FEATURES' "+avx2,-avx512f,..."), or
    this CPU's when None."""
    if listed is None:
        import llvmlite.binding as ll

        return dict(ll.get_host_cpu_features())
    return {f[1:]: f[0] == "+" for f in listed.replace(" ", "").split(",") if len(f) > 1 and f[0] in "+-"}


def target_has(feature: str) -> bool:
    """Whether numba compiles for a CPU with this LLVM feature (e.g. "avx512f"): the kernels that need
    it are written only then."""
    from numba.core import config

    return bool(target_features(getattr(config, "CPU_FEATURES", None)).get(feature))


def choose(requested: str | None, best: str, no_vnni: bool) -> str:
    """The tier for a request (`LARQL_ISA`'s value or None) when numba's target runs `best` at most;
    `no_vnni`: `LARQL_NO_VNNI` set."""
    if requested is not None and requested not in TIERS:
        raise QuantError(f"LARQL_ISA={requested!r}: choose one of {', '.join(TIERS)}")
    tier = best if requested is None else TIERS[min(TIERS.index(requested), TIERS.index(best))]
    return "avx2" if no_vnni and tier == "avx512vnni" else tier


def current() -> str:
    """The tier from the environment and numba's target (what `TIER` holds)."""
    from numba.core import config

    best = tier_of(target_features(getattr(config, "CPU_FEATURES", None)))
    return choose(os.environ.get("LARQL_ISA") or None, best, bool(os.environ.get("LARQL_NO_VNNI")))


TIER = current()


def runs(tier: str) -> bool:
    """Whether `tier`'s kernels can run here: it is TIER or below (the tests' skip condition)."""
    return TIERS.index(tier) <= TIERS.index(TIER)
