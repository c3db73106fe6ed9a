"""What an edit did.

    scoring.py   teacher-forced scoring of targets after prompts, in batches
    evaluate.py  an edit set scored before and after (CounterFact's and EasyEdit's measures, RelS)
    crown.py     crown discovery: which layer's MLP carries a fact
"""
