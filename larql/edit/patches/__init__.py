"""The patch format: what an edit is, in memory and on disk.

    overlay.py    PatchOverlay: per-(layer, feature) vector / metadata overrides and deletions
    weight_op.py  WeightOp: a ROME / MEMIT low-rank addition to one layer's down projection
    patch.py      PatchOp, Patch, PatchStack: .vlp files, recording, stacking and replay
"""
