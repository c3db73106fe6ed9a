"""Hostile patches, traces and statistics caches end in one LarqlError (or, for a cache, in a
recomputation), never in a crash, a hang, an unpickling or a patch that is half applied."""

from __future__ import annotations

import hashlib
import json
import pickle
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from larql.edit.methods import stats
from larql.edit.patches.patch import MAX_PATCH_BYTES
from larql.edit.patches.weight_op import f32_b64 as b64
from larql.errors import LqlSemanticError, ModelFormatError
from larql.lql.executor import execute
from larql.lql.session import Session
from tests.synthetic import TinySpec, tiny_vindex

HIDDEN, FFN, LAYERS, VOCAB = 64, 96, 3, 257


@pytest.fixture(scope="module")
def vx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vindex(tmp_path_factory.mktemp("hostile"), TinySpec("gemma3", n_layers=LAYERS, ffn=FFN), seed=3)


@pytest.fixture
def session(vx: Path) -> Session:
    s = Session()
    execute(f'USE "{vx}"', s)
    return s


def valid_doc() -> dict[str, Any]:
    vec = b64(np.full(HIDDEN, 0.5))
    return {"format": "larql-patch", "version": 1, "name": "p.vlp", "operations": [
        {"op": "insert", "layer": 1, "feature": 5, "gate_vector_b64": vec, "down_vector_b64": vec,
         "down_meta": {"ids": [65, 66], "scores": [1.5, 0.5]}, "entity": "a", "relation": "r", "target": "b"},
        {"op": "delete", "layer": 2, "feature": 7},
        {"op": "weight_edit", "layer": 0, "rank": 1, "u_b64": b64(np.ones(HIDDEN)), "v_b64": b64(np.ones(FFN)),
         "keys_b64": b64(np.ones(FFN)), "facts": [{"subject": "a", "relation": "r", "prompt": "a", "target": "b"}]},
    ]}


def apply_text(session: Session, path: Path, text: str | bytes) -> str:
    """APPLY PATCH on a file with this content: the error's first line; the overlay left untouched."""
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(LqlSemanticError) as err:
        execute(f'APPLY PATCH "{path}"', session)
    assert len(session.vindex.overlay) == 0 and session.vindex.patches.applied == []
    assert session.vindex.overlay.weight_count() == 0
    return str(err.value).splitlines()[0]


def test_the_valid_patch_applies(session: Session, tmp_path: Path) -> None:
    (tmp_path / "ok.vlp").write_text(json.dumps(valid_doc()))
    execute(f'APPLY PATCH "{tmp_path / "ok.vlp"}"', session)
    v = session.vindex
    assert len(v.overlay) == 2 and v.overlay.weight_count() == 1
    assert v.feature_meta(1, 5).token_ids[:2] == (65, 66)


def op(i: int, **fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["operations"][i].update(fields)


@pytest.mark.parametrize("change, expected", [
    (op(0, gate_vector_b64=5), "operation 0: gate_vector_b64 must be a base64 string, not int"),
    (op(0, gate_vector_b64=[1.0] * HIDDEN), "gate_vector_b64 must be a base64 string, not list"),
    (op(0, gate_vector_b64="A" * 10_000_000), "gate vector is longer than this vindex's hidden size \\(64\\) allows"),
    (op(0, down_vector_b64=b64(np.full(HIDDEN, np.nan))), "down vector has NaN or infinite values"),
    (op(0, down_vector_b64=b64(np.ones(HIDDEN - 1))), "down vector has 63 values; this vindex's hidden size is 64"),
    (op(0, down_vector_b64="not base64!"), "down_vector_b64 is not base64"),
    (op(0, down_meta={"ids": [-1], "scores": [1.0]}), "a down_meta token id must be an integer in 0..256, got -1"),
    (op(0, down_meta={"ids": [1 << 40], "scores": [1.0]}), "token id must be an integer in 0..256, got 1099511627776"),
    (op(0, down_meta={"ids": [257], "scores": [1.0]}), "token id must be an integer in 0..256, got 257"),
    (op(0, down_meta={"ids": [True], "scores": [1.0]}), "token id must be an integer in 0..256, got True"),
    (op(0, down_meta={"ids": [3.0], "scores": [1.0]}), "token id must be an integer in 0..256, got 3.0"),
    (op(0, down_meta={"ids": [3], "scores": ["1e999"]}), "down_meta scores must be finite numbers"),  # a bare 1e999
    (op(0, down_meta={"ids": [3], "scores": ["nan"]}), "down_meta scores must be finite numbers"),
    (op(0, down_meta={"ids": [3, 4], "scores": [1.0]}), "with 1 to 1000 ids and as many scores"),
    (op(0, down_meta={"ids": list(range(1001)), "scores": [1.0] * 1001}), "with 1 to 1000 ids"),
    (op(0, down_meta=[1, 2]), 'down_meta must be {"ids": \\[...\\], "scores": \\[...\\]}'),
    (op(0, layer=3), "operation 0: layer must be an integer in 0..2, got 3"),
    (op(0, layer=-1), "layer must be an integer in 0..2, got -1"),
    (op(0, layer="1"), "layer must be an integer in 0..2, got '1'"),
    (op(0, layer=1.0), "layer must be an integer in 0..2, got 1.0"),
    (op(0, feature=96 + 65536), "feature must be an integer in 0..95 \\(or 96.. for a feature METHOD NEURON added\\), got 65632"),
    (op(0, feature=None), "feature must be an integer in 0..95 \\(or 96.. for a feature METHOD NEURON added\\), got None"),
    (op(0, feature=96), "operation 0: feature 96 is past the layer's 96 features: adding it needs a gate, up and down vector \\(up missing\\)"),
    (op(0, entity={"x": 1}), "entity must be a string of at most 10,000 characters"),
    (op(1, op="drop"), "operation 1: not an operation \\(op must be one of insert, update, delete, weight_edit\\)"),
    (op(2, layer=3), "operation 2: weight_edit needs an integer layer in 0..2"),
    (op(2, rank=0), "weight_edit needs an integer rank between 1 and 100000"),
    (op(2, u_b64=7), "u_b64 must be a base64 string"),
    (op(2, v_b64=b64(np.full(FFN, np.inf))), "v has NaN or infinite values"),
    (op(2, keys_b64="A" * 5_000_000), "keys holds more than 96 x 1 values"),
    (op(2, facts="everything"), "facts must be a list of {subject, relation, prompt, target} strings"),
    (lambda d: d.update(operations={"op": "delete"}), 'not a patch file \\(no "operations" list\\)'),
    (lambda d: d.update(version=2), "patch format version 2, this larql reads 1"),
    (lambda d: d.update(format="gguf"), "not a patch file \\(format 'gguf', not 'larql-patch'\\)"),
    (lambda d: d.update(description=["x"]), "description must be a string"),
])
def test_a_hostile_operation_is_refused_whole(session: Session, tmp_path: Path,
                                              change: Callable[[dict[str, Any]], None], expected: str) -> None:
    doc = valid_doc()
    change(doc)
    text = json.dumps(doc).replace('"1e999"', "1e999")  # a literal JSON parses as infinity: no NaN token needed
    message = apply_text(session, tmp_path / "h.vlp", text)
    assert message.startswith(f"1:1: {tmp_path / 'h.vlp'}") and re_search(expected, message), message


def re_search(pattern: str, text: str) -> bool:
    import re

    return re.search(pattern, text) is not None


@pytest.mark.parametrize("text, expected", [
    ("[" * 100_000 + "]" * 100_000, "nested 100000 deep, more than a patch can be \\(16\\)"),
    ('{"operations": [' * 30_000, "nested 60000 deep"),
    ('{"version": 1, "operations": [], "x": NaN}', "not valid JSON, so not a patch file \\(NaN is not a JSON number"),
    (b"\x80\x81", "not UTF-8 text, so not a patch"),
    ('"\\' * 100_000, "not valid JSON, so not a patch file"),
    ("", "not valid JSON, so not a patch file"),
])
def test_a_hostile_document_is_refused(session: Session, tmp_path: Path, text: str | bytes, expected: str) -> None:
    start = time.perf_counter()
    message = apply_text(session, tmp_path / "d.vlp", text)
    assert re_search(expected, message), message
    assert time.perf_counter() - start < 2.0


def test_a_device_or_fifo_is_refused_without_reading(session: Session, tmp_path: Path) -> None:
    import os

    start = time.perf_counter()
    with pytest.raises(LqlSemanticError, match="/dev/zero: not a regular file, so not a patch"):
        execute('APPLY PATCH "/dev/zero"', session)
    fifo = tmp_path / "pipe.vlp"
    os.mkfifo(fifo)  # opening it for reading would block until a writer came
    with pytest.raises(LqlSemanticError, match="pipe.vlp: not a regular file, so not a patch"):
        execute(f'APPLY PATCH "{fifo}"', session)
    assert time.perf_counter() - start < 1.0


def test_an_oversized_patch_is_refused_before_reading(session: Session, tmp_path: Path) -> None:
    big = tmp_path / "big.vlp"
    with open(big, "wb") as f:
        f.truncate(MAX_PATCH_BYTES + 1)  # sparse: no disk used, and nothing may read it
    start = time.perf_counter()
    with pytest.raises(LqlSemanticError, match=f"big.vlp: {MAX_PATCH_BYTES + 1:,} bytes, more than a patch can be"):
        execute(f'APPLY PATCH "{big}"', session)
    assert time.perf_counter() - start < 1.0


# -- the statistics cache: a hostile file is never unpickled and only costs a recomputation -----

class Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path("/tmp/larql-pickle-ran"),))


def _npz(path: Path, **arrays: Any) -> Path:
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def test_a_good_cache_file_loads(tmp_path: Path) -> None:
    cov = np.eye(4, dtype=np.float32) * 2
    mean = np.arange(4, dtype=np.float64)
    stats._save(tmp_path / "c.npz", stats.Moments(cov.astype(np.float64), 100, mean))
    got = stats._load(tmp_path / "c.npz", 4)
    assert got is not None and got.tokens == 100 and np.array_equal(got.cov, np.eye(4) * 2)
    assert np.array_equal(got.mean, mean)
    assert stats._load(tmp_path / "c.npz", 5) is None  # another layer width: not used
    # a cache from before the mean was kept is recomputed, not half-read
    old = _npz(tmp_path / "old.npz", cov=cov, count=np.int64(100), sha256=hashlib.sha256(cov.tobytes()).hexdigest())
    assert stats._load(old, 4) is None
    # the checksum covers the mean too
    with zipfile.ZipFile(tmp_path / "c.npz") as z:
        members = {n[:-4]: np.lib.format.read_array(z.open(n)) for n in z.namelist()}
    members["mean"] = members["mean"] + 1
    assert stats._load(_npz(tmp_path / "bad.npz", **members), 4) is None


def test_a_pickle_in_the_cache_is_never_run(tmp_path: Path) -> None:
    marker = Path("/tmp/larql-pickle-ran")
    marker.unlink(missing_ok=True)
    cov = np.empty(1, dtype=object)
    cov[0] = Boom()
    path = tmp_path / "p.npz"
    with zipfile.ZipFile(path, "w") as z, z.open("cov.npy", "w") as f:
        np.lib.format.write_array(f, cov, allow_pickle=True)
    assert stats._load(path, 4) is None and not marker.exists()
    path.write_bytes(pickle.dumps(Boom()))  # not even a zip
    assert stats._load(path, 4) is None and not marker.exists()


def test_a_cache_header_cannot_make_us_allocate(tmp_path: Path) -> None:
    path = tmp_path / "h.npz"
    with zipfile.ZipFile(path, "w") as z:
        for name, header in (("cov", {"descr": "<f4", "fortran_order": False, "shape": (10**10, 10**10)}),
                             ("count", {"descr": "<i8", "fortran_order": False, "shape": ()}),
                             ("sha256", {"descr": "<U64", "fortran_order": False, "shape": ()})):
            with z.open(f"{name}.npy", "w") as f:
                np.lib.format.write_array_header_1_0(f, header)  # a header and no data
    start = time.perf_counter()
    assert stats._load(path, 2) is None and stats._load(path, 10**10) is None
    assert time.perf_counter() - start < 1.0
    nan = np.full((2, 2), np.nan, np.float32)
    mean = np.zeros(2, np.float32)
    path = _npz(tmp_path / "n.npz", cov=nan, mean=mean, count=np.int64(5), sha256=stats._digest(nan, mean))
    assert stats._load(path, 2) is None


# -- trace files ----------------------------------------------------------------------------------

def test_hostile_trace_files_are_refused(session: Session, tmp_path: Path) -> None:
    from larql.model.trace_file import load_trace

    good = tmp_path / "t.trace"
    execute(f'TRACE "ab" POSITIONS ALL SAVE "{good}"', session)
    assert load_trace(good, vocab=VOCAB).residual.shape[0] == LAYERS + 1
    data = bytearray(good.read_bytes())
    o_res = int(np.frombuffer(bytes(data[32:40]), "<u8")[0])
    nan = bytearray(data)
    nan[o_res:o_res + 4] = np.float32(np.nan).tobytes()
    (tmp_path / "nan.trace").write_bytes(bytes(nan))
    with pytest.raises(ModelFormatError, match="the trace's residual block has NaN or infinite values"):
        load_trace(tmp_path / "nan.trace")
    o_prompt = int(np.frombuffer(bytes(data[56:64]), "<u8")[0])
    long = bytearray(data)
    long[o_prompt:o_prompt + 4] = np.uint32(1 << 31).tobytes()
    (tmp_path / "long.trace").write_bytes(bytes(long))
    with pytest.raises(ModelFormatError, match="the prompt runs past the end"):
        load_trace(tmp_path / "long.trace")
    with pytest.raises(ModelFormatError, match="token id \\d+ is outside the vocabulary \\(0..9\\)"):
        load_trace(good, vocab=10)
    with pytest.raises(ModelFormatError, match="no such trace file \\(or not a regular file\\)"):
        load_trace("/dev/zero")
