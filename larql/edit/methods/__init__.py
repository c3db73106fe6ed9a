"""How a fact becomes an edit: one module per method, and the steps they share.

    strategies.py     each method as one strategy INSERT dispatches to (EditRequest in, Recorded out)
    defaults.py       the methods' names and defaults (importable without the runtime: the planner)
    facts.py          Fact, and the prompts an edit is optimised on
    neuron.py         METHOD NEURON: one new FFN neuron per subject (neuron_settle.py settles a layer's)
    query_neuron.py   METHOD NEURON keyed on the query: a neuron per fact at the prompt's last token
    rome.py           the down-projection solve of ROME (one fact) and MEMIT (a batch)
    weight_edit.py    ROME / MEMIT end to end: keys, values, low-rank updates
    feature.py        METHOD FEATURE: one selective feature installed through the overlay
    value.py          the value step: what a layer's MLP should output at the subject's (or the last) token
    capture.py        activations at a few hook points, stopping after the last
    stats.py          key statistics C = E[k k^T] of a layer's down-projection input
    metrics.py        each layer's key metric (C + ridge)^-1: from memory, the cache, or computed
    neighbours.py     nearby subjects, whose keys an edit holds still
    relations.py      the subject's other relations, held and checked
"""
