"""The examples run and print what they promise (so they cannot rot)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_run_model_example() -> None:
    r = subprocess.run([sys.executable, str(EXAMPLES / "run_model.py")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "prompt ids: [2, 818, 5279, 529, 7001, 563]" in r.stdout
    assert "' Paris'" in r.stdout
    assert "blocks.8.hook_resid_post: (6, 640)" in r.stdout
    assert "The capital of France is the capital of the country of France." in r.stdout


def test_interp_tour_example() -> None:
    import re

    r = subprocess.run([sys.executable, str(EXAMPLES / "interp_tour.py")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "captured 254 hook points; blocks.9.attn.hook_pattern (6, 4, 6)" in r.stdout
    m = re.search(r"log p\(' Paris'\) (\S+) -> (\S+), log p\(' Berlin'\) (\S+) -> (\S+)", r.stdout)
    assert m, r.stdout
    paris_before, paris_after, berlin_before, berlin_after = (float(x.rstrip(",")) for x in m.groups())
    assert paris_after < paris_before - 2 and berlin_after > berlin_before + 2  # the patch moves the answer
    assert "TRACE 'The capital of France is' FOR ' Paris'" in r.stdout and "['L17', 3, 0.084" in r.stdout
