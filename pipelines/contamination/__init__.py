"""The contamination audit's pure functions (pipelines/audit_contamination.py runs them).

Modules: `ngrams` (GPT-3's words and stable 64-bit n-gram hashes), `index` (the evaluation
sets' n-gram -> example index every worker loads), `eval_sets` (the evaluation splits an
audit is handed: it reads no evaluation file itself).
"""
