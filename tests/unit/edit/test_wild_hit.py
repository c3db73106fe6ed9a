"""Reading a greedy continuation for the edit's words (the WILD protocol's hit)."""

from __future__ import annotations

from larql.edit.measure.generation import names, wild_hit


def test_whole_words_any_case() -> None:
    assert names(" rome, of course", "Rome")
    assert not names(" Romeo and Juliet", "Rome")
    assert names(" in New York City", " New York")
    assert not names(" anything", " ")


def test_new_target_and_not_the_old() -> None:
    assert wild_hit(" Rome. It is", "Rome", "Paris") == 1.0
    assert wild_hit(" Rome, not Paris", "Rome", "Paris") == 0.0
    assert wild_hit(" Paris", "Rome", "Paris") == 0.0
    assert wild_hit(" Rome", "Rome", None) == 1.0
