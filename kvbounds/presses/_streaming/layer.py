"""The layer a streaming press keeps: a :class:`~kvbounds.e2e.WeightedLayer` that asks its press to
reduce every layer before it would hold more than ``target + interval`` tokens.

The first layer's ``update`` (the first cache write of every forward pass) checks whether the new tokens would push
the layers past ``target + interval`` and, if so, has the press reduce every layer back to ``target`` before they
are appended: so the bound holds for any chunk of at most ``interval`` tokens, whatever ``interval`` and the
chunks are, inside the press's context or after it (kvpress's pipeline answers outside it). Operations that would
separate the press's per-row state from the rows (beam search's reordering, batch selection or repetition) are
refused; ``crop`` cuts tokens appended since the last reduction, or returns to the state the press recorded when
its context was last exited (kvpress's pipeline asks each question from there).
"""
from __future__ import annotations

import numpy as np
import torch

from kvbounds.algorithms.validation import InputError
from kvbounds.e2e import WeightedLayer


class StreamingLayer(WeightedLayer):
    """One layer of a streaming press's cache (see the module docstring): ``press``, the press that keeps it,
    ``index``, its layer index, ``session``, the press's session it belongs to (a press used on a new cache starts a
    new session; the old cache's layers then refuse to run)."""

    def __init__(self, keys, values, log_w_num, log_w_den, *, logical_length, press, index: int):
        super().__init__(keys, values, logical_length=logical_length)
        self.press, self.index, self.session = press, int(index), press.session
        if log_w_num is not None and not bool((log_w_num == 0).all()):
            # padding (-inf) set directly: a row may still be all padding here (left padding longer than a chunk)
            self.log_w_num = log_w_num.float().to(keys.device)
            self.log_w_den = self.log_w_num if log_w_den is log_w_num else log_w_den.float().to(keys.device)

    def _check_session(self) -> None:
        if self.session != self.press.session:
            raise InputError("this cache's streaming press has since been used on another cache: its state is "
                             "that cache's now (use one press per cache, or reset the cache)")

    def update(self, key_states, value_states, *args, **kwargs):
        self._check_session()
        if not bool(torch.isfinite(key_states).all()) or not bool(torch.isfinite(value_states).all()):
            raise InputError("the new keys or values contain NaN or inf: the streaming press cannot compress them")
        if self.index == 0:
            self.press.make_room(int(key_states.shape[-2]))
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        self.press.peak = max(self.press.peak, int(keys.shape[-2]))
        return keys, values

    def _refuse(self, what: str):
        raise InputError(f"{what} is not supported with a streaming press: its state (random streams, SubGen's "
                         "centres and counts, the certificate's sums) is per row and would not follow the rows; "
                         "use greedy or sampled decoding with one sequence per row (num_beams=1, "
                         "num_return_sequences=1)")

    def reorder_cache(self, beam_idx) -> None:
        self._refuse("beam search (reordering the cache's rows)")

    def batch_select_indices(self, indices) -> None:
        self._refuse("selecting rows of the cache")

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._refuse("repeating the cache's rows")

    def crop(self, max_length: int) -> None:
        """Keep the first ``max_length`` logical tokens (negative: remove that many): tokens appended since the last
        reduction are cut; a length the press recorded when its context was exited restores that state (every layer
        and the press's own state); anything else that was compressed away raises InputError."""
        self._check_session()
        if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)):
            raise InputError(f"crop takes an integer length, got {max_length!r}")
        max_length = int(max_length)
        n = max_length if max_length >= 0 else self.logical_length + max_length
        if n < self.logical_length and self.press.restore(n):
            return
        super().crop(n)
