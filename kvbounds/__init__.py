"""kvbounds: which guarantees of streaming attention / KV-cache compression hold, with what constants.

The claim registry (:mod:`kvbounds.registry`), records (:mod:`kvbounds.records`), the sweep runner
(:mod:`kvbounds.runner`), verdicts (:mod:`kvbounds.verdict`) and the report (:mod:`kvbounds.report`).
"""
__version__ = "0.1.0"
