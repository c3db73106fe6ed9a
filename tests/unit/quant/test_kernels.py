"""Numba kernels and numpy references against gguf-py, on seeded random blocks of every type."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from larql.errors import QuantError
from larql.quant import BLOCK_LAYOUT, GGMLType, QuantMatrix, dequantize_reference, repack, row_bytes, tensor

ALL_TYPES = list(BLOCK_LAYOUT)
# byte offsets of f16 scale fields per block; random bytes there could be inf/nan, so they are
# replaced by finite random halves
_F16_FIELDS = {GGMLType.Q4_0: [0], GGMLType.Q4_1: [0, 2], GGMLType.Q5_0: [0], GGMLType.Q5_1: [0, 2],
               GGMLType.Q8_0: [0], GGMLType.Q4_K: [0, 2], GGMLType.Q5_K: [0, 2], GGMLType.Q6_K: [208]}


def random_matrix(qtype: GGMLType, n_rows: int, n_cols: int, seed: int = 0) -> QuantMatrix:
    rng = np.random.default_rng(seed)
    if qtype == GGMLType.F32:
        raw = rng.standard_normal((n_rows, n_cols)).astype(np.float32).view(np.uint8)
    elif qtype in (GGMLType.F16, GGMLType.BF16):
        vals = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
        raw = (vals.astype(np.float16) if qtype == GGMLType.F16 else (vals.view(np.uint32) >> 16).astype(np.uint16)).view(np.uint8)
    else:
        _, type_size = BLOCK_LAYOUT[qtype]
        blocks = rng.integers(0, 256, size=(n_rows * row_bytes(qtype, n_cols) // type_size, type_size), dtype=np.uint8)
        for off in _F16_FIELDS[qtype]:
            halves = (rng.standard_normal(len(blocks)) * 0.01).astype(np.float16)
            blocks[:, off:off + 2] = halves.view(np.uint8).reshape(-1, 2)
        raw = blocks.reshape(n_rows, -1)
    return QuantMatrix("test", qtype, n_rows, n_cols, np.ascontiguousarray(raw).reshape(n_rows, -1))


def gguf_dequant(m: QuantMatrix) -> np.ndarray:
    return gguf.quants.dequantize(m.raw, gguf.GGMLQuantizationType(int(m.qtype))).reshape(m.shape)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_is_bit_exact_against_gguf(qtype: GGMLType) -> None:
    m = random_matrix(qtype, 37, 512, seed=int(qtype))
    expected = gguf_dequant(m).astype(np.float32)
    ours = m.dequantize()
    ref = dequantize_reference(m.raw, qtype, m.n_cols)
    assert np.array_equal(ours.view(np.uint32), expected.view(np.uint32)), f"{qtype.name}: numba kernel differs"
    assert np.array_equal(ref.view(np.uint32), expected.view(np.uint32)), f"{qtype.name}: numpy reference differs"


@pytest.mark.parametrize("qtype", sorted(repack.REPACKABLE), ids=lambda t: t.name)
def test_repacked_parts_rebuild_the_exact_weights(qtype: GGMLType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensor, "REPACK_DIRECT", True)  # the types decode reads directly too
    m = random_matrix(qtype, 37, 512, seed=3 + int(qtype))
    packed = m.repacked()
    assert packed is not None and packed.q.dtype == np.int8
    assert (packed.offset is not None) == (qtype in repack.HAS_OFFSET)
    exact = gguf_dequant(m).astype(np.float32).view(np.uint32)
    assert np.array_equal(packed.dequantize().view(np.uint32), exact)
    # the numba dequantization the BLAS path takes once a matrix is repacked, whole and in part
    whole = repack.dequantize_into(packed, slice(0, 37), np.empty((37, 512), dtype=np.float32))
    part = repack.dequantize_into(packed, slice(5, 9), np.empty((4, 512), dtype=np.float32))
    assert np.array_equal(whole.view(np.uint32), exact) and np.array_equal(part.view(np.uint32), exact[5:9])


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 3, 11, 40])  # matvec, matmul_small (rows one by one; 4 at a time + 3), BLAS
@pytest.mark.parametrize("repacking", [True, False], ids=["repacked", "blocks"])
def test_matmul_matches_float_matmul(qtype: GGMLType, n_tok: int, repacking: bool,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if not repacking:
        monkeypatch.setattr(tensor, "_repack_budget", [0])
    monkeypatch.setattr(tensor, "REPACK_DIRECT", True)  # repacked: every repackable type; blocks: none
    m = random_matrix(qtype, 70, 512, seed=1 + int(qtype))
    assert (m.repacked() is not None) == (repacking and qtype in repack.REPACKABLE)
    w = gguf_dequant(m).astype(np.float64)
    x = np.random.default_rng(5).standard_normal((n_tok, 512)).astype(np.float32)
    expected = x.astype(np.float64) @ w.T
    got = m.matmul(x)
    assert got.shape == (n_tok, 70) and got.dtype == np.float32
    err = np.abs(got - expected).max() / np.abs(expected).max()
    assert err < 2e-6, f"{qtype.name} x{n_tok}: relative error {err:.2e}"
    if n_tok == 1:
        assert np.allclose(m.matmul(x[0]), got[0], rtol=0, atol=0)


@pytest.mark.parametrize("qtype", [GGMLType.Q8_0, GGMLType.Q6_K, GGMLType.Q4_1, GGMLType.F16], ids=lambda t: t.name)
def test_a_kept_dense_copy_gives_the_same_products(qtype: GGMLType, monkeypatch: pytest.MonkeyPatch) -> None:
    """dense() is dequantize() kept read-only; once kept, the batched products (over chunks of rows,
    the last one short) and top_k / top1 read it and give the same bits as dequantizing per call."""
    monkeypatch.setattr(tensor, "CHUNK_ROWS", 32)
    monkeypatch.setattr(tensor, "REPACK_DIRECT", True)
    x = np.random.default_rng(9).standard_normal((40, 512)).astype(np.float32)  # past the small-batch kernels
    fresh = random_matrix(qtype, 70, 512, seed=21 + int(qtype))
    fresh.repacked()  # the path that dequantizes from the repacked copy, where it exists
    kept = random_matrix(qtype, 70, 512, seed=21 + int(qtype))
    d = kept.dense()
    assert d is kept.dense() and not d.flags.writeable  # one array while held
    assert np.array_equal(d.view(np.uint32), fresh.dequantize().view(np.uint32))
    with pytest.raises(ValueError):
        d[0, 0] = 1.0
    want = fresh.matmul(x), fresh.top_k(x, 5), fresh.top1(x)

    def no_dequantization(*args: object, **kw: object) -> None:
        raise AssertionError("dequantized again although a dense copy is kept")

    monkeypatch.setattr(QuantMatrix, "dequantize", no_dequantization)
    monkeypatch.setattr(repack, "dequantize_into", no_dequantization)
    assert np.array_equal(kept.matmul(x).view(np.uint32), want[0].view(np.uint32))
    assert np.array_equal(kept.top_k(x, 5), want[1])
    for a, b in zip(kept.top1(x), want[2]):
        assert np.array_equal(a, b)
    monkeypatch.undo()
    del d  # the matrix holds its copy weakly: gone with its last holder, made again when asked
    assert kept._dense[0]() is None and not kept.dense().flags.writeable


def _mapped_at(address: int) -> bool:
    with open("/proc/self/maps", encoding="ascii") as f:
        return any(int(line.split("-", 1)[0], 16) == address for line in f)


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads /proc/self/maps (Linux)")
def test_a_dense_copy_is_a_mapping_of_its_own_unmapped_when_freed() -> None:
    """An ended editing session's float32 copies leave the process at once, whatever the heap keeps."""
    d = random_matrix(GGMLType.Q8_0, 64, 512, seed=3).dense()
    address = d.ctypes.data
    assert _mapped_at(address)
    del d
    assert not _mapped_at(address)


@pytest.mark.parametrize("qtype", [GGMLType.Q8_0, *sorted(repack.REPACKABLE)], ids=lambda t: t.name)
def test_a_small_batch_is_each_row_alone(qtype: GGMLType) -> None:
    """The small-batch kernels take four rows at a time (each weight widened once for the four) and
    the rest one by one: every row is the one-row kernel's answer (a server's batched decode step
    equals each sequence's own step)."""
    m = random_matrix(qtype, 70, 512, seed=7 + int(qtype))
    x = np.random.default_rng(6).standard_normal((11, 512)).astype(np.float32)
    alone = np.stack([m.matmul(x[t:t + 1])[0] for t in range(11)])
    np.testing.assert_allclose(m.matmul(x), alone, rtol=0, atol=2e-6 * np.abs(alone).max())


@pytest.mark.parametrize("qtype", [GGMLType.F32, GGMLType.Q8_0, GGMLType.Q6_K], ids=lambda t: t.name)
def test_top_k_is_the_k_largest_of_the_product(qtype: GGMLType, monkeypatch: pytest.MonkeyPatch) -> None:
    """top_k over weight-row chunks (three chunks here, the last one short) equals ranking the
    whole product: the same ids, by value descending."""
    monkeypatch.setattr(tensor, "CHUNK_ROWS", 32)
    m = random_matrix(qtype, 70, 512, seed=11 + int(qtype))
    x = np.random.default_rng(8).standard_normal((5, 512)).astype(np.float32)
    full = x @ m.dequantize().T  # (5, 70)
    got = m.top_k(x, 9)
    assert got.shape == (5, 9) and got.dtype == np.int64
    assert np.array_equal(got, np.argsort(-full, axis=1, kind="stable")[:, :9])
    assert np.array_equal(np.sort(m.top_k(x, 500), axis=1), np.tile(np.arange(70), (5, 1)))  # k past the rows: all
    with pytest.raises(QuantError, match="top_k takes rows of 512 values"):
        m.top_k(x[0], 3)


@pytest.mark.parametrize("n", [3, 40], ids=["small-batch kernel", "chunks"])
@pytest.mark.parametrize("softcap", [0.0, 4.0], ids=["plain", "soft-capped"])
def test_top1_is_the_argmax_of_the_product_and_its_log_probability(n: int, softcap: float,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """top1 over weight-row chunks (three here, the last one short) gives matmul's argmax exactly
    (the first on a tie, as np.argmax) and the log-softmax of the soft-capped scores there."""
    monkeypatch.setattr(tensor, "CHUNK_ROWS", 32)
    m = random_matrix(GGMLType.Q8_0, 70, 512, seed=5)
    x = np.random.default_rng(9).standard_normal((n, 512)).astype(np.float32)
    x[1] = 0.0  # every score 0: a 70-way tie, id 0
    scores32 = m.matmul(x)  # (n, 70)
    if softcap:  # as forward.logits caps them: saturated scores tie, and the first id wins
        scores32 = np.tanh(scores32 / np.float32(softcap)) * np.float32(softcap)
    scores = scores32.astype(np.float64)
    ids, logp = m.top1(x, softcap)
    assert ids.dtype == np.int64 and logp.dtype == np.float64
    assert np.array_equal(ids, scores32.argmax(axis=1)) and ids[1] == 0
    top = scores.max(axis=1)
    want = scores[np.arange(n), ids] - top - np.log(np.exp(scores - top[:, None]).sum(axis=1))  # log-softmax there
    np.testing.assert_allclose(logp, want, rtol=0, atol=1e-5)
    assert logp[1] == pytest.approx(-np.log(70))
    with pytest.raises(QuantError, match="top1 takes rows of 512 values"):
        m.top1(x[0])


def test_rows_gathers_embeddings() -> None:
    m = random_matrix(GGMLType.Q8_0, 50, 64)
    full = m.dequantize()
    idx = np.array([3, 3, 49, 0])
    assert np.array_equal(m.rows(idx), full[idx])
    assert np.array_equal(m.row(7), full[7])


def test_wrong_shapes_raise_quant_error() -> None:
    m = random_matrix(GGMLType.Q4_K, 4, 256)
    with pytest.raises(QuantError, match=r"cannot multiply 4x256 weights by an input of shape \[3\]"):
        m.matmul(np.zeros(3, np.float32))
    with pytest.raises(QuantError, match="not a whole number of 256-weight blocks"):
        row_bytes(GGMLType.Q4_K, 100)
    with pytest.raises(QuantError, match=r"expected uint8\[4, 144\]"):
        QuantMatrix("bad", GGMLType.Q4_K, 4, 256, np.zeros((4, 143), np.uint8))
    with pytest.raises(QuantError, match="row 9 out of range"):
        m.row(9)
