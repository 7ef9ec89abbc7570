"""One check module per claim id. Each exposes CLAIM, trials(profile), run_trial(params, seed, backend)
and summarize(records); see :mod:`kvbounds.registry` for the protocol and :mod:`kvbounds.proofs_checks.common`."""
