"""One check module per claim id. Each exposes CLAIM, trials(profile), run_trial(params, seed, backend)
and summarize(records); see :mod:`kvbounds.claims` for the protocol and :mod:`kvbounds.proofs_checks.common`."""
if __name__ != "kvbounds.proofs_checks":   # the subpackage kvbounds.proofs_checks (pyproject.toml's package-dir)
    raise ImportError(f"import kvbounds.proofs_checks, not {__name__}: the folder proofs_checks/ is a subpackage of kvbounds")
