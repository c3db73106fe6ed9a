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
