"""``kvbounds traces extract``: extract real q/k/v traces into the cache (see :mod:`kvbounds.traces.real`).

    kvbounds traces extract --model smollm2 --tokens 2048 [--layers 0,3,5-7|all] [--text FILE] [--cache-dir DIR]
    kvbounds traces list [--cache-dir DIR]

``add_parser(subparsers)`` registers the ``traces`` command on the top-level parser; ``run(args)`` runs it
and returns the exit status (2 with a clear message when a model package is missing).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from kvbounds.algorithms.validation import InputError

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("traces", help="real-model attention traces (extract into the cache, list it)")
    sub = p.add_subparsers(dest="traces_cmd", required=True)
    e = sub.add_parser("extract", help="extract per-layer, per-head q/k/v of a real model on real text")
    e.add_argument("--model", required=True, choices=("smollm2", "minilm"))
    e.add_argument("--tokens", type=int, required=True, help="number of tokens (SmolLM2: up to 8192)")
    e.add_argument("--layers", default="all", help="'all' (default) or a list like 0,3,5-7")
    e.add_argument("--text", default=None, help="a UTF-8 text file (default: Python's pydoc_data.topics)")
    e.add_argument("--cache-dir", default=None, help="cache root (default: $KVBOUNDS_CACHE or ~/.cache/kvbounds)")
    e.add_argument("--force", action="store_true", help="extract again even if cached")
    e.add_argument("--json", action="store_true", help="print the sidecar JSON")
    ls = sub.add_parser("list", help="list cached extractions")
    ls.add_argument("--cache-dir", default=None)
    return p


def run(args) -> int:

    from . import real
    if args.traces_cmd == "list":
        root = real.cache_root(args.cache_dir) / "traces"
        metas = sorted(root.glob("*/meta.json")) if root.exists() else []
        if not metas:
            print(f"no cached traces under {root}")
        for m in metas:
            d = json.loads(m.read_text())
            print(f"{m.parent}: {d['model']} n={d['n_tokens']} layers={len(d['layers'])} "
                  f"text={d['text_source']} " + (f"ppl={d['perplexity']:.3g}" if d.get("perplexity") else ""))
        return 0
    t0 = time.perf_counter()
    try:
        ex = real.extract(args.model, args.tokens, layers=args.layers, text=args.text, cache_dir=args.cache_dir,
                          force=args.force)
    except real.ModelUnavailable as e:
        print(f"kvbounds traces: cannot extract {args.model}: {e}\n"
              f"(the checks fall back to synthetic traces and say so in their verdicts)", file=sys.stderr)
        return 2
    except (InputError, ValueError, real.ExtractionError) as e:
        print(f"kvbounds traces: {e}", file=sys.stderr)
        return 2
    dt = time.perf_counter() - t0
    m = ex.meta
    if args.json:
        print(json.dumps(m, indent=1))
        return 0
    ver = m["verification"]
    worst = max(v["max_head_rel_err"] for v in ver.values())
    print(f"{m['model']}: {m['n_tokens']} tokens, layers {m['layers'][0]}..{m['layers'][-1]} ({len(m['layers'])}) "
          f"in {ex.path}")
    print(f"  text: {m['text_source']} (sha256 {m['text_hash'][:12]}), model file sha256 {m['file_hash'][:12]}")
    print(f"  verified: attention recomputed from the captured q/k/v matches the model's own, worst head "
          f"rel. error {worst:.2e} (tol {m['verify_tol']:.0e})")
    if m.get("perplexity") is not None:
        print(f"  perplexity on the text: {m['perplexity']:.3f}")
    if m.get("similarity"):
        s = m["similarity"]
        print(f"  sentence similarity: paraphrases {min(s['paraphrase']):.2f}..{max(s['paraphrase']):.2f}, unrelated "
              f"{min(s['unrelated']):.2f}..{max(s['unrelated']):.2f} ({'sane' if s['sane'] else 'NOT sane'})")
    print(f"  layout: {m['layout']['gqa']}; {m['layout']['rope']}")
    print(f"  {dt:.1f} s (cached extraction reused)" if dt < 1.0 else f"  {dt:.1f} s")
    return 0
