"""RULER-style synthetic tasks, generated offline from a seed with real filler text (the stdlib's
``pydoc_data.topics``, as the other tasks of :mod:`kvbounds.e2e._tasks`).

The task families and prompt templates follow RULER (Hsieh et al., "RULER: What's the Real Context Size of Your
Long-Context Language Models?", arXiv 2404.06654, Table 1 and App. B), at the lengths a CPU can run:

* ``niah_single``: one needle "One of the special magic numbers for <key> is: <7 digits>." at a depth in the
  haystack; the question asks for the key's number. The needle-depth x context-length sweep is this task with the
  depth fixed (``depth`` in [0, 1]) instead of drawn.
* ``niah_multikey``: four needles with different keys (three distractors); one key is asked.
* ``niah_multivalue``: four needles with the same key and different numbers; all four are asked, in the order
  they appear.
* ``vt`` (variable tracking): a chain "VAR A = 12345." "VAR B = VAR A." ... of four hops spread through the
  haystack; asked: every variable assigned 12345, in the chain's order.
* ``cwe`` (common-words extraction): a numbered list of words in which five words appear more often than the
  rest (16, 13, 10, 8 and 6 times against 2); asked: the five most common, from the most to the least common.
  (RULER gives its common words one frequency and grades the set; teacher forcing needs an order, so here the
  frequencies differ and the order is theirs.)

Scoring, as the passkey's: the answer's tokens teacher-forced after the question (log-likelihood) and exact match
(every greedy token of the answer right given the right ones before it: RULER's string match where the answer is
read in one order). The answer prefix ends where the answer's content starts (RULER's "... is" continued by the
needle's own ": "), so that no scored token is a separator the model may write another way. Keys and filler words are drawn from the text's own vocabulary (lower-case words of 4-9
letters), so nothing is downloaded. Each generator returns a :class:`kvbounds.e2e._tasks.Task` of ``n`` tokens of
context (the two settings, question after or inside the compressed prompt, as the other tasks).
"""
from __future__ import annotations

import functools
import re

import numpy as np

from ._tasks import Task, _answer_task, _filler

__all__ = ["KINDS", "NIAH_INTRO", "NEEDLES", "CWE_COUNTS", "CWE_RARE", "vocabulary", "niah_task", "vt_task", "cwe_task",
           "make"]

KINDS = ("niah_single", "niah_multikey", "niah_multivalue", "vt", "cwe")
NIAH_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. I will "
              "quiz you about the numbers afterwards.\n")
NEEDLES = 4            # needles of the multi-key and multi-value tasks, hops of the variable chain
CWE_COUNTS = (16, 13, 10, 8, 6)   # occurrences of the common words, most common first
CWE_RARE = 2                      # occurrences of every other word


@functools.lru_cache(maxsize=1)
def vocabulary() -> tuple[str, ...]:
    """The filler text's distinct lower-case words of 4-9 letters, sorted (keys and list words are drawn from it)."""
    from kvbounds.traces.real import default_text
    return tuple(sorted(set(re.findall(r"\b[a-z]{4,9}\b", default_text()))))


def _words(rng, k: int) -> list[str]:
    v = vocabulary()
    return [v[i] for i in rng.choice(len(v), size=k, replace=False)]


def _number(rng) -> str:
    return str(int(rng.integers(1_000_000, 10_000_000)))


def _haystack(lm, n: int, pieces: list[np.ndarray], depths: list[float], seed: int, intro: str) -> np.ndarray:
    """``intro``, then filler text with each piece inserted at its depth (a fraction of the filler, in order), then
    nothing: ``n`` tokens in all."""
    head = lm.encode(intro)
    body = n - len(head) - sum(len(p) for p in pieces)
    if body < 1:
        raise ValueError(f"n = {n} tokens cannot hold the task's {sum(len(p) for p in pieces) + len(head)} fixed tokens")
    filler = _filler(lm, body, seed)
    cuts = [int(round(float(d) * body)) for d in depths]
    out, last = [head], 0
    for cut, piece in sorted(zip(cuts, pieces), key=lambda cp: cp[0]):
        out += [filler[last:cut], piece]
        last = cut
    out.append(filler[last:])
    return np.concatenate(out)


def _needle(lm, key: str, value: str) -> np.ndarray:
    return lm.encode(f" One of the special magic numbers for {key} is: {value}. ")


def niah_task(lm, n: int, seed: int, kind: str = "niah_single", setting: str = "after",
              depth: float | None = None) -> Task:
    """A needle-in-a-haystack task of RULER's three kinds (module docstring); ``depth``: the asked needle's depth
    (the sweep), else uniform in [0.1, 0.9]."""
    if kind not in KINDS[:3]:
        raise ValueError(f"kind must be one of {KINDS[:3]}, got {kind!r}")
    rng = np.random.default_rng([seed, KINDS.index(kind)])
    d0 = float(rng.uniform(0.1, 0.9)) if depth is None else float(depth)
    if kind == "niah_single":
        keys, values = _words(rng, 1), [_number(rng)]
        depths = [d0]
    elif kind == "niah_multikey":
        keys, values = _words(rng, NEEDLES), [_number(rng) for _ in range(NEEDLES)]
        depths = [d0] + [float(x) for x in rng.uniform(0.05, 0.95, NEEDLES - 1)]
    else:
        keys, values = _words(rng, 1) * NEEDLES, [_number(rng) for _ in range(NEEDLES)]
        depths = sorted(float(x) for x in rng.uniform(0.05, 0.95, NEEDLES))   # the values in order of appearance
    ctx = _haystack(lm, n, [_needle(lm, k, v) for k, v in zip(keys, values)], depths, seed, NIAH_INTRO)
    key = keys[0]
    if kind == "niah_multivalue":
        question = (f"\nWhat are all the special magic numbers for {key} mentioned in the provided text? The special "
                    f"magic numbers for {key} mentioned in the provided text are: ")
        answer = ", ".join(values)
    else:
        question = (f"\nWhat is the special magic number for {key} mentioned in the provided text? The special magic "
                    f"number for {key} mentioned in the provided text is: ")
        answer = values[0]
    return _answer_task(kind, lm, ctx, question, answer, dict(depth=d0, key=key, items=len(answer.split(",")),
                                                              n=int(len(ctx))), setting)


def _variable(rng) -> str:
    return "".join(chr(ord("A") + int(i)) for i in rng.integers(0, 26, 5))


def vt_task(lm, n: int, seed: int, setting: str = "after") -> Task:
    """Variable tracking: a chain of :data:`NEEDLES` assignments spread through the haystack, in order."""
    rng = np.random.default_rng([seed, KINDS.index("vt")])
    value = str(int(rng.integers(10000, 100000)))
    names: list[str] = []
    while len(names) < NEEDLES:
        v = _variable(rng)
        if v not in names:
            names.append(v)
    lines = [f" VAR {names[0]} = {value}. "] + [f" VAR {b} = VAR {a}. " for a, b in zip(names, names[1:])]
    depths = list(np.linspace(0.1, 0.9, NEEDLES))
    ctx = _haystack(lm, n, [lm.encode(s) for s in lines], depths, seed,
                    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n")
    question = (f"\nQuestion: Find all variables that are assigned the value {value} in the text above. Answer: "
                f"According to the chain(s) of variable assignment in the text above, {NEEDLES} variables are "
                f"assigned the value {value}, they are:")
    return _answer_task("vt", lm, ctx, question, " " + " ".join(names), dict(value=value, items=NEEDLES,
                                                                            n=int(len(ctx))), setting)


def cwe_task(lm, n: int, seed: int, setting: str = "after") -> Task:
    """Common-words extraction: a numbered list of ``n`` tokens (after a one-line instruction) in which the words
    of :data:`CWE_COUNTS` appear that often and every other word :data:`CWE_RARE` times, shuffled."""
    rng = np.random.default_rng([seed, KINDS.index("cwe")])
    intro = lm.encode("Below is a numbered list of words. In these words, some appear more often than others. "
                      "Memorize the ones that appear most often.\n")
    k = len(CWE_COUNTS)
    pool = _words(rng, 400)
    common, rare = pool[:k], pool[k:]
    entries = [w for w, c in zip(common, CWE_COUNTS) for _ in range(c)]
    tokens = lambda ws: lm.encode("".join(f"{i + 1}. {w}\n" for i, w in enumerate(ws)))
    r = 0
    while r < len(rare) and len(intro) + len(tokens(entries + rare[:r + 1] * CWE_RARE)) <= n:
        r += 1
    words = entries + rare[:r] * CWE_RARE
    order = rng.permutation(len(words))
    listing = tokens([words[i] for i in order])
    if len(intro) + len(listing) > n:
        raise ValueError(f"n = {n} tokens cannot hold the common words' {len(entries)} entries")
    pad = _filler(lm, n - len(intro) - len(listing), seed)     # exactly n tokens: unrelated text first
    ctx = np.concatenate([pad, intro, listing])
    question = (f"\nQuestion: What are the {k} most common words in the above list, from the most to the least "
                f"common? Answer: The top {k} words that appear most often in the list are:\n1.")
    answer = " " + "\n".join(f"{i + 1}. {w}" for i, w in enumerate(common))[3:]
    return _answer_task("cwe", lm, ctx, question, answer, dict(items=k, rare_words=r, n=int(len(ctx))), setting)


def make(kind: str, lm, n: int, seed: int, setting: str = "after", depth: float | None = None) -> Task:
    """The task ``kind`` (one of :data:`KINDS`) of ``n`` tokens from ``seed``; ``depth`` only for the needle tasks."""
    if kind in KINDS[:3]:
        return niah_task(lm, n, seed, kind, setting, depth)
    if depth is not None:
        raise ValueError(f"depth applies to the needle tasks only, not {kind!r}")
    if kind == "vt":
        return vt_task(lm, n, seed, setting)
    if kind == "cwe":
        return cwe_task(lm, n, seed, setting)
    raise ValueError(f"unknown RULER-style task {kind!r}; choose from {', '.join(KINDS)}")
