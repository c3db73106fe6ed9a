"""The hand-written backward pass (model/grad.py) against the real forward and finite differences."""

from __future__ import annotations

import numpy as np
import pytest

import larql
from larql.model.grad import Tail, TailContext
from tests.synthetic import TinySpec, hf_weights, write_gguf

IDS = np.array([5, 71, 72, 3, 200, 9, 9, 44, 120, 17])  # longer than the gemma3 sliding window of 4


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def deep_tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> larql.Model:
    spec = TinySpec(arch=request.param, n_layers=4)
    path = tmp_path_factory.mktemp("grad") / f"{spec.arch}.gguf"
    write_gguf(path, spec, hf_weights(spec, seed=3))
    return larql.load(path)


def _tail(m: larql.Model, first: int, start: int) -> tuple[Tail, TailContext, np.ndarray]:
    name = f"blocks.{first}.hook_resid_mid"
    _, cache = m.run_with_cache(IDS, names=[name])
    resid = cache[name]
    tail = Tail(m.config, m.weights, first)
    ctx = TailContext(IDS, start, resid[start:])
    tail.prepare([ctx], [resid])
    return tail, ctx, m.weights.output.dequantize()


def test_tail_forward_is_the_model(deep_tiny: larql.Model) -> None:
    tail, ctx, emb = _tail(deep_tiny, 1, 4)
    y, _ = tail.forward([ctx], {})
    real = deep_tiny.forward(IDS)[4:]
    assert np.abs(y @ emb.T - real).max() <= 1e-5 * np.abs(real).max()


def test_tail_forward_with_delta_matches_a_hook(deep_tiny: larql.Model) -> None:
    """delta added to layer 2's MLP output (before Gemma's post-FFN norm) at the subject row."""
    tail, ctx, emb = _tail(deep_tiny, 1, 4)
    delta = np.random.default_rng(1).standard_normal(deep_tiny.config.hidden).astype(np.float32)
    y, _ = tail.forward([ctx], {2: delta})

    def add(x: np.ndarray, name: str) -> np.ndarray:
        x = x.copy()
        x[4] += delta
        return x

    real = deep_tiny.forward(IDS, hooks={"blocks.2.hook_mlp_out": add})[4:]
    assert np.abs(y @ emb.T - real).max() <= 1e-5 * np.abs(real).max()


def test_backward_matches_finite_differences(deep_tiny: larql.Model) -> None:
    cfg = deep_tiny.config
    tail, ctx, emb = _tail(deep_tiny, 1, 4)
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((ctx.n, cfg.vocab)).astype(np.float32)
    deltas = {1: rng.standard_normal(cfg.hidden).astype(np.float32) * 0.5,
              3: rng.standard_normal(cfg.hidden).astype(np.float32) * 0.5}

    def loss(d: dict[int, np.ndarray]) -> float:
        y, _ = tail.forward([ctx], d)
        return float(np.sum((y.astype(np.float64) @ emb.T.astype(np.float64)) * weights))

    _, saves = tail.forward([ctx], deltas)
    grads = tail.backward([ctx], deltas, saves, (weights @ emb).astype(np.float32))
    for layer in deltas:
        num = np.zeros(cfg.hidden)
        for j in range(cfg.hidden):
            plus = {k: v.copy() for k, v in deltas.items()}
            minus = {k: v.copy() for k, v in deltas.items()}
            plus[layer][j] += 1e-2
            minus[layer][j] -= 1e-2
            num[j] = (loss(plus) - loss(minus)) / 2e-2
        assert np.linalg.norm(num - grads[layer]) <= 5e-3 * np.linalg.norm(num), layer


def test_tail_over_several_contexts_is_the_model_on_each(deep_tiny: larql.Model) -> None:
    """Contexts of different lengths and subject positions share each matmul (prepare and forward
    stack their rows; prepare runs a prefix two contexts share once, and the leading tokens several
    prefixes share once: IDS[:4] whole, then IDS[:5] for the last two); every context must still see
    only its own tokens."""
    name = "blocks.1.hook_resid_mid"
    seqs = [IDS, IDS[:6][::-1].copy(), np.array([7, 8, 250, 31, 2, 60, 61]), np.array([*IDS[:4], 99, 98, 97]),
            np.array([4, 3]), np.array([*IDS[:5], 77, 76, 75]), np.array([*IDS[:5], 40, 41])]
    starts = [4, 2, 5, 4, 0, 6, 6]
    resids = [deep_tiny.run_with_cache(s, names=[name])[1][name] for s in seqs]
    ctxs = [TailContext(s, st, r[st:]) for s, st, r in zip(seqs, starts, resids)]
    tail = Tail(deep_tiny.config, deep_tiny.weights, 1)
    tail.prepare(ctxs, resids)
    y, _ = tail.forward(ctxs, {})
    emb = deep_tiny.weights.output.dequantize()
    row = 0
    for s, st in zip(seqs, starts):
        real = deep_tiny.forward(s)[st:]
        got = y[row: row + len(s) - st] @ emb.T
        assert np.abs(got - real).max() <= 1e-5 * np.abs(real).max()
        row += len(s) - st


@pytest.mark.parametrize("edited", [(1, 2), (1, 3)])
def test_a_tail_kept_to_some_rows_gives_their_outputs_and_gradients(deep_tiny: larql.Model,
                                                                   edited: tuple[int, ...]) -> None:
    """forward(keep=rows) runs the last layer's attention output and MLP at those rows alone: the same
    outputs there, and the same gradients for a loss that reads only them (with a delta at the last
    layer itself every row runs, as before)."""
    cfg = deep_tiny.config
    name = "blocks.1.hook_resid_mid"
    seqs = [IDS, np.array([7, 8, 250, 31, 2, 60, 61]), np.array([*IDS[:5], 77, 76, 75])]
    starts = [4, 3, 5]
    resids = [deep_tiny.run_with_cache(s, names=[name])[1][name] for s in seqs]
    ctxs = [TailContext(s, st, r[st:]) for s, st, r in zip(seqs, starts, resids)]
    tail = Tail(cfg, deep_tiny.weights, 1)
    tail.prepare(ctxs, resids)
    rng = np.random.default_rng(5)
    deltas = {layer: rng.standard_normal(cfg.hidden).astype(np.float32) * 0.5 for layer in edited}
    n = sum(c.n for c in ctxs)
    keep = np.array([0, 3, 5, 6, 8, n - 1])  # rows in every context, the first and last of some
    y_all, saves_all = tail.forward(ctxs, deltas)
    y, saves = tail.forward(ctxs, deltas, keep)
    assert y.shape == (len(keep), cfg.hidden)
    assert np.abs(y - y_all[keep]).max() <= 1e-5 * np.abs(y_all).max()
    dy = rng.standard_normal((len(keep), cfg.hidden)).astype(np.float32)
    dy_all = np.zeros_like(y_all)
    dy_all[keep] = dy
    want = tail.backward(ctxs, deltas, saves_all, dy_all)
    got = tail.backward(ctxs, deltas, saves, dy)
    for layer in edited:
        assert np.linalg.norm(got[layer] - want[layer]) <= 1e-5 * np.linalg.norm(want[layer]), layer
    for bad in (keep[::-1], np.array([0, 3, 3])):  # the backward scatters by assignment: refused, not summed wrong
        with pytest.raises(ValueError, match="strictly increasing"):
            tail.forward(ctxs, deltas, bad)


def test_values_of_several_subjects_in_one_pass_equal_each_alone(deep_tiny: larql.Model) -> None:
    """optimise_values batches subjects through one tail (a (G, hidden) delta, each context adding its
    group's row); each subject's value, key and step count must be what it gets optimised alone."""
    from larql.edit.methods.facts import Fact
    from larql.edit.methods.value import optimise_value, optimise_values

    groups = [[Fact("ab", "xx ab yy", "qq", "r")], [Fact("cd", "zz cd ww", "rs", "r"), Fact("cd", "cd is", "t", "s")],
              [Fact("ef", "ef of", "uv", "r")]]
    together = optimise_values(deep_tiny, groups, [1, 2], ["pp ", "oo "], max_steps=8)
    for facts, got in zip(groups, together):
        alone = optimise_value(deep_tiny, facts, [1, 2], ["pp ", "oo "], max_steps=8)
        assert got.steps == alone.steps and got.top1 == alone.top1
        assert abs(got.nll_after - alone.nll_after) <= 1e-4 * max(1.0, abs(alone.nll_after))
        for layer in (1, 2):
            np.testing.assert_allclose(got.keys[layer], alone.keys[layer], rtol=1e-6, atol=1e-6)
            scale = float(np.abs(alone.deltas[layer]).max())
            assert np.abs(got.deltas[layer] - alone.deltas[layer]).max() <= 1e-3 * scale


def test_a_subject_the_model_knows_nothing_about_is_held_by_romes_kl_prompt_alone(
        deep_tiny: larql.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """`unknown` subjects get UNKNOWN_KL_PROMPTS (fewer contexts), the others all of KL_PROMPTS, side
    by side in one batch: each value is the one optimised alone with its own KL prompts."""
    from larql.edit.methods import value
    from larql.edit.methods.facts import Fact

    known, unknown = [Fact("ab", "xx ab yy", "qq", "r")], [Fact("cd", "zz cd ww", "rs", "r")]
    got = value.optimise_values(deep_tiny, [known, unknown], [1, 2], ["pp "], max_steps=8, unknown={"cd"})
    assert len(value._group_prompts(deep_tiny, unknown, ["pp "], value.UNKNOWN_KL_PROMPTS).ctx_ids) == 2 + 1
    alone_known = value.optimise_value(deep_tiny, known, [1, 2], ["pp "], max_steps=8)
    monkeypatch.setattr(value, "KL_PROMPTS", value.UNKNOWN_KL_PROMPTS)
    alone_unknown = value.optimise_value(deep_tiny, unknown, [1, 2], ["pp "], max_steps=8)
    for batched, alone in ((got[0], alone_known), (got[1], alone_unknown)):
        assert batched.steps == alone.steps
        for layer in (1, 2):
            scale = float(np.abs(alone.deltas[layer]).max())
            assert np.abs(batched.deltas[layer] - alone.deltas[layer]).max() <= 1e-3 * scale
    monkeypatch.undo()
    # a known subject keeps every KL prompt (this random model's softmax is saturated, so their
    # gradient is ~1e-9 here and cannot show in the value: the count is what is checked)
    assert len(value._group_prompts(deep_tiny, known, ["pp "], value.KL_PROMPTS).ctx_ids) == 2 + len(value.KL_PROMPTS)
    assert len(value.KL_PROMPTS) > len(value.UNKNOWN_KL_PROMPTS)


def test_the_value_step_makes_its_extra_steps_and_no_forward_pass_only_to_see_the_last(
        deep_tiny: larql.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """After every target token wins (here: from the 3rd step on, as the loss says), EXTRA_STEPS more
    updates are made and the loop ends: one forward and one backward pass per step, the last update
    not run forward again only to be seen."""
    from larql.edit.methods import value
    from larql.edit.methods.facts import Fact

    calls = {"loss": 0, "forward": 0, "backward": 0}
    loss_grad, forward, backward = value._loss_grad, Tail.forward, Tail.backward

    def wins_from_the_third(*a, **k):  # type: ignore[no-untyped-def]
        calls["loss"] += 1
        nll, _, kept, dy = loss_grad(*a, **k)
        return nll, calls["loss"] >= 3, kept, dy

    def count(name, fn):  # type: ignore[no-untyped-def]
        def run(*a, **k):  # type: ignore[no-untyped-def]
            calls[name] += 1
            return fn(*a, **k)
        return run

    monkeypatch.setattr(value, "_loss_grad", wins_from_the_third)
    monkeypatch.setattr(Tail, "forward", count("forward", forward))
    monkeypatch.setattr(Tail, "backward", count("backward", backward))
    for extra in (2, 1, 0):
        monkeypatch.setattr(value, "EXTRA_STEPS", extra)
        calls.update(loss=0, forward=0, backward=0)
        got = value._optimise_values(deep_tiny, [[Fact("cd", "zz cd ww", "rs", "r")]], [1, 2], ["pp "], None, 25,
                                     value.KL_WEIGHT, None, value.WEIGHT_DECAY, value.CLAMP)[0]
        updates = 2 + extra  # two before the first top-1, then the extra ones
        assert got.top1 and calls["backward"] == updates
        assert got.steps == calls["forward"] == calls["loss"] == (updates if extra else 3)


def test_a_value_that_cannot_win_within_the_small_bounds_is_optimised_again_with_romes(
        deep_tiny: larql.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """Values are kept small (value.CLAMP); a subject whose target cannot win within that clamp gets
    ROME's looser bounds, and the better result is the one returned."""
    from larql.edit.methods import value
    from larql.edit.methods.facts import Fact

    facts = [Fact("ab", "xx ab yy", "qq", "r")]

    def run(decay: float, clamp: float) -> value.ValueResult:
        return value._optimise_values(deep_tiny, [facts], [1, 2], ["pp "], None, 12, value.KL_WEIGHT, None,
                                      decay, clamp)[0]

    monkeypatch.setattr(value, "CLAMP", 1e-6)  # no delta can win
    tiny, rome = run(value.WEIGHT_DECAY, 1e-6), run(value.ROME_WEIGHT_DECAY, value.ROME_CLAMP)
    assert not tiny.top1 and rome.nll_after < tiny.nll_after
    got = value.optimise_values(deep_tiny, [facts], [1, 2], ["pp "], max_steps=12)[0]
    assert got.nll_after == pytest.approx(rome.nll_after, rel=1e-6) and got.top1 == rome.top1
    for layer in (1, 2):
        np.testing.assert_allclose(got.deltas[layer], rome.deltas[layer], rtol=1e-6, atol=1e-7)


def test_models_measured_to_need_romes_value_bounds_get_them() -> None:
    from larql.edit.methods import value

    assert value.value_bounds("smollm2-135m") == (value.ROME_WEIGHT_DECAY, value.ROME_CLAMP)
    assert value.value_bounds("gemma3-270m") == (value.WEIGHT_DECAY, value.CLAMP)
