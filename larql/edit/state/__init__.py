"""The editable state of a vindex.

    view.py      EditableVindex: store + overlay + patch stack; overlay-aware reads, model()
    edited.py    EditTarget: what an edit needs of the editable state (the methods take it)
    walk_ffn.py  OverlayEdits: the overlay as the FFN's edit strategy (model/ffn.py FFNEdits)
    load_any.py  which kind of source a path is (alias, GGUF, HF directory, vindex) and its model
"""
