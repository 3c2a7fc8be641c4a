"""Studies a reviewer accepts (`omrl study`): methods compared at a matched budget over seeds and conditions, on
held-out tasks that are new by fingerprint, the test set scored once, the primary contrast declared up front.

spec.py: the study file and its settings hash; fingerprint.py: task fingerprints; overlap.py: the overlap
report and the refusal; tasksets.py: a study's task sets loaded and screened; ledger.py: the test ledger;
stats.py: seed-level figures and the two-level bootstrap; check.py: `omrl study check` as an API; compare.py:
methods trained and scored from one SFT checkpoint per seed, resumably (shared with the benchmarks); run.py:
`omrl study run` as an API (tuning on dev, the test set scored through the ledger, study.json); figures.py:
study.json's seed-level figures, its table and headline.
"""
