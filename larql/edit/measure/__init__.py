"""What an edit did.

    scoring.py   teacher-forced scoring of targets after prompts, in batches
    evaluate.py  an edit set scored before and after (CounterFact's and EasyEdit's measures, RelS)
    generation.py  scoring by the model's own greedy continuation (the "WILD" protocol)
    perplexity.py  perplexity of a held-out text (general capability after edits)
    features.py  an edit seen through SAEs: the features it moved, on its prompts and unrelated ones
    crown.py     crown discovery: which layer's MLP carries a fact
"""
