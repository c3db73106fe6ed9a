"""Editing a vindex, above the read-only store: the patch overlay, patches, the editable view LQL
uses, the walk FFN adapter, feature INSERT and COMPILE. Nothing here writes a base vindex.

    overlay.py         PatchOverlay: per-(layer, feature) vector / metadata overrides and deletions
    patch.py           PatchOp, Patch, PatchStack: .vlp files, recording, stacking and replay
    view.py            EditableVindex: store + overlay + patch stack; overlay-aware reads, model()
    walk_ffn.py        OverlayEdits: the overlay as the FFN's edit strategy (model/ffn.py FFNEdits)
    feature_insert.py  INSERT by installing one selective FFN feature
    compile.py         COMPILE ... INTO VINDEX / MODEL FORMAT GGUF
"""
