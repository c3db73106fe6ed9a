"""Editing a vindex, above the read-only store. Nothing here writes a base vindex.

    patches/    the patch format: the in-memory overlay, the low-rank weight delta, .vlp files and stacks
    state/      the editable state: EditableVindex (store + overlay + patches), the walk FFN, load_any
    methods/    how a fact becomes an edit: NEURON, ROME, MEMIT, FEATURE and the steps they share
    measure/    what an edit did: teacher-forced scoring, the edit-set evaluation, crown discovery
    insert.py   INSERT: facts in, one method's patch applied (or nothing), and a report of what it did
    maintain/   a patch stack over time: MERGE, DIFF, REBALANCE, COMPACT
    bake/       edits into files: COMPILE to a vindex, GGUF or safetensors; wider FFN layers; convert
"""
