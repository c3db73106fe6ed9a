"""Edits baked into files.

    compile.py  COMPILE: a standalone vindex, or a GGUF / safetensors model
    widen.py    wider FFN layers for the neurons METHOD NEURON added
    convert.py  `larql convert`: between the forms a model takes
"""
