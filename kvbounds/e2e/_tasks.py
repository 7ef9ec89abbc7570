"""The end-to-end tasks, generated offline from the stdlib text ``pydoc_data.topics``.

* ``ppl``: a window of ``n`` tokens of real text is the context; the next ``cont`` tokens are held out and
  scored (per-token negative log-likelihood, paired against exact attention).
* ``passkey``: filler text with "The pass key is NNNNN. Remember it. NNNNN is the pass key." at a random depth,
  then the question "What is the pass key? The pass key is " (the space before the key included); the key's digit tokens are scored
  teacher-forced (log-likelihood) and by exact match (every greedy token right).
* ``lines``: LongEval-style line retrieval (the format of SubGen Table 1 / ClusterGen Table 2's benchmark):
  "line <adjective>-<noun>: REGISTER_CONTENT is <NNNNN>" lines, then "Tell me what is the REGISTER_CONTENT in
  line <name>? ... The REGISTER_CONTENT in line <name> is <" and the number is scored like the passkey.

A task instance is a :class:`Task`: ``context`` (compressed after an exact prefill) and ``tail`` (fed after the
compressed cache), with ``targets`` the positions in ``tail`` whose next token is scored.

Two settings for passkey / lines: ``after`` (the harness's first: the question is fed after the
compressed prompt, so no method can choose by it) and ``inside`` (the papers' LongBench setting: the question
ends the compressed prompt, inside its exact last window, so SnapKV-style methods see it; only its last token
and the answer are fed after compression - that token is exact in both cases).
"""
from __future__ import annotations

import dataclasses

import numpy as np

ADJ = ("torpid", "righteous", "amber", "brisk", "calm", "dusty", "eager", "fancy", "gentle", "hollow", "icy",
       "jolly", "keen", "lucky", "mellow", "noble", "odd", "proud", "quiet", "rapid", "shy", "tidy", "vivid",
       "witty", "young", "zesty", "bold", "crisp", "daring", "early")
NOUN = ("kid", "ethernet", "river", "falcon", "garden", "harbor", "island", "jacket", "kettle", "ladder",
        "meadow", "needle", "orchard", "pepper", "quartz", "rocket", "saddle", "tunnel", "umbrella", "violin",
        "wagon", "yarn", "zebra", "anchor", "bridge", "candle", "desert", "engine", "forest", "glacier")


@dataclasses.dataclass
class Task:
    kind: str                 # "ppl" | "passkey" | "lines"
    context: np.ndarray       # token ids compressed after the exact prefill
    tail: np.ndarray          # token ids fed after the compressed cache
    targets: np.ndarray       # ids scored: tail[1:] for ppl; the answer's tokens otherwise
    answer: str = ""
    meta: dict = dataclasses.field(default_factory=dict)


def _text_ids(lm) -> np.ndarray:
    from kvbounds.traces.real import default_text
    key = id(lm)
    if _CACHE.get("key") != key:
        _CACHE.update(key=key, ids=lm.encode(default_text()))
    return _CACHE["ids"]


_CACHE: dict = {}


def ppl_task(lm, n: int, cont: int, window_index: int) -> Task:
    """Window ``window_index`` of the text: tokens [s, s + n) as context, the next ``cont`` as continuation."""
    ids = _text_ids(lm)
    stride = n + cont
    s = window_index * stride
    if s + stride > len(ids):
        raise ValueError(f"text has {len(ids)} tokens: window {window_index} of {stride} does not fit")
    ctx, tail = ids[s:s + n], ids[s + n:s + n + cont]
    return Task("ppl", ctx, tail[:-1], tail[1:], meta=dict(start=int(s)))


def _filler(lm, n_tokens: int, offset: int) -> np.ndarray:
    ids = _text_ids(lm)
    o = (offset * 7919) % max(1, len(ids) - n_tokens)
    return ids[o:o + n_tokens]


SETTINGS = ("after", "inside")


def _answer_task(kind: str, lm, prefix: np.ndarray, question: str, answer: str, meta: dict,
                 setting: str = "after") -> Task:
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    q, a = lm.encode(question), lm.encode(answer)
    meta = dict(meta, question_len=len(q), setting=setting)
    if setting == "inside":        # the question ends the compressed prompt; its last token starts the tail
        return Task(kind, np.concatenate([prefix, q[:-1]]), np.concatenate([q[-1:], a[:-1]]), a, answer=answer,
                    meta=meta)
    tail = np.concatenate([q, a[:-1]])
    # the whole question is the tail (never compressed); the model must predict a from q
    return Task(kind, prefix, tail, a, answer=answer, meta=meta)


def passkey_task(lm, n: int, seed: int, setting: str = "after") -> Task:
    """Context of about ``n`` tokens with the pass key at a uniform depth in [10%, 90%]."""
    rng = np.random.default_rng(seed)
    key = f"{int(rng.integers(10000, 100000))}"
    needle = lm.encode(f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n")
    intro = lm.encode("There is an important pass key hidden inside a lot of irrelevant text. Find it and "
                      "memorize it.\n")
    body = n - len(needle) - len(intro)
    depth = float(rng.uniform(0.1, 0.9))
    filler = _filler(lm, body, seed)
    cut = int(depth * body)
    ctx = np.concatenate([intro, filler[:cut], needle, filler[cut:]])
    # the space before the key ends the question (digits are tokens of their own, after a space token of its own in
    # both tokenizers): the scored tokens are the key's digits, not a separator the model may write another way
    return _answer_task("passkey", lm, ctx, "\nWhat is the pass key? The pass key is ", key,
                        dict(depth=depth, key=key, n=int(len(ctx))), setting)


def lines_task(lm, n: int, seed: int, setting: str = "after", n_lines: int | None = None) -> Task:
    """As many "line name: REGISTER_CONTENT is <number>" lines as fit in about ``n`` tokens (at most ``n_lines``
    when given: the rest of the n tokens is unrelated real text before the record); one is asked."""
    rng = np.random.default_rng(seed)
    intro = lm.encode("Below is a record of lines I want you to remember. Each line begins with 'line <line "
                      "index>' and contains a '<REGISTER_CONTENT>' at the end of the line as a numerical value. "
                      "For each line index, memorize its corresponding <REGISTER_CONTENT>. At the end of the "
                      "record, I will ask you to retrieve the corresponding <REGISTER_CONTENT> of a certain "
                      "line index. Now the record start:\n\n")
    names, lines, total = set(), [], len(intro)
    while True:
        name = f"{ADJ[rng.integers(len(ADJ))]}-{NOUN[rng.integers(len(NOUN))]}"
        if name in names:
            continue
        num = f"{int(rng.integers(10000, 100000))}"
        ids = lm.encode(f"line {name}: REGISTER_CONTENT is <{num}>\n")
        if total + len(ids) > n or (n_lines is not None and len(lines) >= n_lines):
            break
        names.add(name)
        lines.append((name, num, ids))
        total += len(ids)
    j = int(rng.integers(len(lines)))
    name, num, _ = lines[j]
    pad = _filler(lm, n - total, seed)       # exactly n tokens: unrelated text before the record
    ctx = np.concatenate([pad, intro] + [ids for _, _, ids in lines])
    q = (f"\nNow the record is over. Tell me what is the <REGISTER_CONTENT> in line {name}? I need the number.\n"
         f"Answer: The <REGISTER_CONTENT> in line {name} is <")
    return _answer_task("lines", lm, ctx, q, num, dict(n_lines=len(lines), asked=j, depth=j / len(lines),
                                                       n=int(len(ctx))), setting)
