"""Vindexfile builds: `larql build DIR` turns a recipe (FROM, PATCH, INSERT, DELETE, LABELS,
EXPOSE, STAGE) into a vindex, through a cache keyed by the inputs' checksums
(vindex_spec/VINDEXFILE.md). vindexfile.py parses, run.py plans and runs, labels.py writes LABELS."""
