"""GET|POST /v1/attention on a real server: the same numbers as `interp.attention_patterns` run
locally (float32 through JSON and back, bit for bit), one layer or all, and its refusals."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np

import larql
from larql.model.interp import attention_patterns


def test_one_layer_and_all_layers_equal_the_local_patterns(infer: str, infer_vx: Path) -> None:
    m = larql.load(infer_vx)
    local = attention_patterns(m, m.tokenize("hello there"))
    one = httpx.get(f"{infer}/v1/attention", params={"prompt": "hello there", "layer": 2}, timeout=120).json()
    assert one["layers"] == [2] and one["ids"] == local.ids and one["tokens"] == local.tokens
    assert one["heads"] == m.config.n_heads
    assert np.array_equal(np.asarray(one["patterns"], dtype=np.float32), local.pattern[2:3])
    every = httpx.post(f"{infer}/v1/attention", json={"prompt": "hello there"}, timeout=120).json()
    assert every["layers"] == [0, 1, 2, 3]
    assert np.array_equal(np.asarray(every["patterns"], dtype=np.float32), local.pattern)


def test_refusals_are_json_errors(infer: str, browse: str) -> None:
    cases = [(infer, {}, "the parameter 'prompt' is required"),
             (infer, {"prompt": "hi", "layer": "x"}, "layer must be an integer"),
             (infer, {"prompt": "hi", "layer": 9}, "no layer 9 (layers 0..3)"),
             (infer, {"prompt": "word " * 300, "layer": 0}, "at most 256"),
             (browse, {"prompt": "hi"}, "browse-level")]
    for url, params, message in cases:
        r = httpx.get(f"{url}/v1/attention", params=params, timeout=120)
        assert r.status_code == 400 and message in r.json()["error"]["message"], (params, r.text)
