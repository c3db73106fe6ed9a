"""A vindex's edits over time.

    merge.py      MERGE: another patch file's or vindex's edits added to these
    diff.py       DIFF: what differs between two vindexes of one model, and the patch that makes it
    rebalance.py  REBALANCE: a layer's FEATURE inserts re-tuned against each other
    compact.py    COMPACT: a patch stack folded into fewer operations with the same overlay
"""
