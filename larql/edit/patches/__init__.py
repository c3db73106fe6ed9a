"""The patch format: what an edit is, in memory and on disk.

    overlay.py    PatchOverlay: per-(layer, feature) vector / metadata overrides and deletions
    delta.py      LowRankDelta: a ROME / MEMIT low-rank addition to one layer's down projection
    weight_op.py  WeightOp: that delta as a patch operation, with the facts it teaches
    patch.py      PatchOp, Patch, PatchStack: .vlp files, recording, stacking and replay
"""
