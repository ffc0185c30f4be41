"""Regression suites of dif's own commands (`dif regress`): strict correctness checks and noise-aware
performance checks against recorded baselines (`dif.regress.suite`)."""
