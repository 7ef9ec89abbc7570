"""kvbounds: which guarantees of streaming attention / KV-cache compression hold, with what constants.

The claim registry (:mod:`kvbounds.claims`), records (:mod:`kvbounds.core`), the sweep runner (:mod:`kvbounds.run`),
verdicts (:mod:`kvbounds.verdict`) and the report (:mod:`kvbounds.report`);
``kvbounds.evaluate(SPEC)`` evaluates any press or compressor against the battery (:mod:`kvbounds.evaluation`),
and :mod:`kvbounds.testing` serves researchers' own test suites.

The repository's top-level folders theory/, algorithms/, proofs_checks/, gpu/ and traces/ are the subpackages
kvbounds.theory, ... through relative symlinks kvbounds/<folder> -> ../<folder>. A checkout made without symlinks
(git's core.symlinks=false, e.g. on Windows without developer mode) holds those links as one-line text files: the
folders are then found one level up, beside kvbounds/.
"""
import os as _os

if not _os.path.isdir(_os.path.join(__path__[0], "algorithms")):   # links checked out as text files
    __path__.append(_os.path.dirname(_os.path.abspath(__path__[0])))

__version__ = "0.1.0"


def __getattr__(name):
    """``kvbounds.evaluate(SPEC, ...)``: :func:`kvbounds.evaluation.evaluate`, imported on first use (importing
    kvbounds stays light)."""
    if name == "evaluate":
        from kvbounds.evaluation import evaluate
        return evaluate
    raise AttributeError(f"module 'kvbounds' has no attribute {name!r}")
