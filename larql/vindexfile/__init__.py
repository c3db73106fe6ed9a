"""The Vindexfile builder: `larql build DIR` turns a recipe (FROM, PATCH, INSERT, DELETE, LABELS,
EXPOSE, STAGE) into a vindex, through a cache keyed by the inputs' checksums
(vindex_spec/VINDEXFILE.md). It sits above lql/: INSERT and DELETE steps run as LQL.

    parse.py    the Vindexfile parser: instructions, stages, their LQL checked
    run.py      plans the steps, runs the ones not cached, writes the output atomically
    labels.py   LABELS: feature labels given by hand, written as feature_labels.jsonl
"""
