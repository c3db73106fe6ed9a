"""Statement handlers, grouped by family; each takes (statement, session) and returns a Result.

    lifecycle.py    USE, EXTRACT, STATS, SHOW MODELS, DIFF
    query.py        DESCRIBE, WALK, EXPLAIN WALK, SELECT, the SHOW statements
    inference.py    INFER, TRACE, EXPLAIN INFER, CROWN
    editing.py      INSERT, DELETE, UPDATE, the patch statements, COMPILE
    maintenance.py  MERGE, REBALANCE, COMPACT, SHOW COMPACT STATUS
    sae.py          USE SAE, SHOW SAES, DROP SAE, FEATURES; sae_rows.py: the SAE features EXPLAIN INFER and DESCRIBE show
"""
