"""The ``reproduction`` dimension of an empirical claim's verdict (:mod:`kvbounds.verdict`): the
shared rule per variant and setup (:func:`reproduction_status`), one label over variants and setups
(:func:`combine_reproductions`), and the statement it implies (:func:`statement_from_reproduction`).
Re-exported by :mod:`kvbounds.verdict`."""
from __future__ import annotations

import math
from typing import Sequence

from ._fields import Reproduction


def statement_from_reproduction(reproduction: str, *, same_setup: bool = False) -> str:
    """An empirical claim's statement: ``holds`` when reproduced; a partial, failed or reversed reproduction
    on a *different* setup (model, size) is ``inconclusive`` (the headline says "not reproduced on <setup>");
    on the paper's own setup, ``not-reproduced``/``reversed`` make it ``false``."""
    if reproduction == "reproduced":
        return "holds"
    if same_setup and reproduction in ("not-reproduced", "reversed"):
        return "false"
    return "inconclusive"


def combine_reproductions(reps: Sequence[Reproduction]) -> str:
    """One label over variants/setups: all the same -> that label; any reproduced/partial -> partial; else
    not-shown when any variant was underpowered (nothing is evidence against then), else not-reproduced."""
    st = {r.status for r in reps} - {"n/a"}
    if not st:
        return "n/a"
    if len(st) == 1:
        return st.pop()
    if st & {"reproduced", "partial"}:
        return "partial"
    return "not-shown" if "not-shown" in st else "not-reproduced"


# the stricter reproduction rule (issue 21)
PARTIAL_SHARE = 0.25        # count-type criteria: "partial" needs at least this share of the cells
MIN_INSTANCES = 8           # test-type criteria: a cell counts only with this many independent instances ...
MIN_REDRAWS = 5             # ... and, for a randomised method, when significant in most of this many redraws
REPRODUCTION_KINDS = ("count", "test")


def reproduction_status(better: int, worse: int, cells: int, *, kind: str = "count", powered: bool = True) -> str:
    """The shared rule for a comparative empirical claim, per variant of the method and per setup.

    Over ``cells`` cells (after duplicate comparisons are merged: a baseline that falls back to another counts
    once), ``better`` cells show the claimed direction significantly and ``worse`` cells the opposite direction:
      * ``reproduced``      better >= 3/4 of the cells and no cell significantly the other way,
      * ``reversed``        worse >= 3/4 of the cells and no cell significantly in the claimed direction,
      * ``partial``         short of ``reproduced``, with at least max(1, 1/4 of the cells) better cells, for
                            both kinds (one rule everywhere): ``kind="count"`` counts cells meeting a criterion;
                            ``kind="test"`` counts a cell only when it has >= :data:`MIN_INSTANCES` independent
                            instances and, for a randomised method, is significant in most of >= :data:`MIN_REDRAWS`
                            redraws of the method's randomness,
      * ``not-reproduced``  otherwise, when the cells had the power to show the effect (evidence against;
                            the caller gives the bound on the effect in ``Reproduction.bound_note``),
      * ``not-shown``       otherwise, when they had not (``powered=False``: too few instances or redraws, or
                            the smallest detectable effect above the effect expected; inconclusive).
    """
    if kind not in REPRODUCTION_KINDS:
        raise ValueError(f"kind must be one of {REPRODUCTION_KINDS}, got {kind!r}")
    if cells <= 0:
        return "n/a"
    if better >= math.ceil(0.75 * cells) and worse == 0:
        return "reproduced"
    if worse >= math.ceil(0.75 * cells) and better == 0:
        return "reversed"
    if better >= max(1, math.ceil(PARTIAL_SHARE * cells)):
        return "partial"
    return "not-reproduced" if powered else "not-shown"
