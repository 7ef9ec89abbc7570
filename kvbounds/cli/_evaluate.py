"""``kvbounds evaluate SPEC [--ratio R] [--profile smoke|quick|full] [--e2e] [--decode] [--out DIR]``: any press or
compressor against the battery at equal memory (:mod:`kvbounds.evaluation`).

Exit 0 with the calls printed; 2 with one line naming the problem (a SPEC that does not import or is no press /
compressor, a ratio outside [0, 1), a press that raises or returns a bad cache, a trial that raised, an --out that
is a `kvbounds check` store), nothing but resumable records written; 1 for an unusable --out; 130 / 143 on Ctrl-C / SIGTERM (rerun to resume).
"""
from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser("evaluate", help="any press or compressor against the battery of controls at equal memory, on "
                                        "adversarial and real KV streams (better / tied / worse), optionally end to end")
    p.add_argument("spec", metavar="SPEC", help="a registered method, kvpress:NAME (kvpress:KnormPress), or "
                                                "module:NAME (a kvpress BasePress subclass or instance, or a compressor "
                                                "with the method contract; the current directory is on the path)")
    p.add_argument("--ratio", type=float, default=0.75,
                   help="kvpress's compression ratio (the fraction of the cache removed) of the headline: the battery "
                        "runs at 1 - R of the cache's floats too (default 0.75: 25%%)")
    p.add_argument("--profile", choices=("smoke", "quick", "full"), default="quick")
    p.add_argument("--e2e", action="store_true", help="also the leaderboard's tasks inside SmolLM2 (perplexity, "
                                                      "passkey, lines; question after and inside the prompt)")
    p.add_argument("--decode", action="store_true", help="also the decode-time check (the cache recompressed as "
                                                         "the stream grows); on by itself for a decoding press")
    p.add_argument("--out", default=None, help="output directory (default evaluation/<SPEC>)")
    p.add_argument("--workers", type=int, default=None,
                   help="processes for the stream trials (default: all cores; smoke runs in this process)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true")


def run(args) -> int:
    from kvbounds.algorithms.validation import InputError
    from kvbounds.evaluation import CARD_FILE, JSON_FILE, default_out, evaluate
    from kvbounds.core import StoreError, StoreOfOtherCommand
    from kvbounds.run import Terminated, sigterm_raises
    out = args.out or default_out(args.spec)
    if args.workers is not None and args.workers < 1:
        print(f"kvbounds evaluate: --workers must be >= 1, got {args.workers}", file=sys.stderr)
        return 2
    try:
        with sigterm_raises():
            result = evaluate(args.spec, ratio=args.ratio, profile=args.profile, e2e=args.e2e, decode=args.decode,
                              out=out, workers=args.workers, seed=args.seed, progress=not args.quiet)
    except KeyboardInterrupt:
        print(f"kvbounds evaluate: interrupted; finished trials are kept in {out}; rerun to resume", file=sys.stderr)
        return 130
    except Terminated:
        print(f"kvbounds evaluate: terminated; finished trials are kept in {out}; rerun to resume", file=sys.stderr)
        return 143
    except StoreOfOtherCommand as e:          # a `kvbounds check` store as --out: refused before any work
        print(f"kvbounds evaluate: {e}", file=sys.stderr)
        return 2
    except StoreError as e:
        print(f"kvbounds evaluate: error: {e}", file=sys.stderr)
        return 1
    except (InputError, ValueError) as e:
        print(f"kvbounds evaluate: {e}", file=sys.stderr)
        return 2
    print_result(result)
    print(f"wrote {out}/{JSON_FILE} and {out}/{CARD_FILE} (records: {out}/results.jsonl)")
    return 0


def print_result(result: dict) -> None:
    from kvbounds.verdict import call_words
    print(f"{result['method']} ({result['kind']}), profile {result['profile']}, {result['streams']} streams; "
          f"at {100 * result['fraction']:.0f}% of the cache's floats: {result['headline']}")
    for fam in result["families"]:
        print(f"  {fam}: {result['regime'][fam]['text']}")
        for c in result["calls"]:
            if c["family"] == fam and c["fraction"] == result["fraction"]:
                print(f"    {call_words(c, family=False)}")
    for m in result.get("not_run", []):
        print(f"  not run: {m}")
    for key in ("decode", "e2e"):
        part = result.get(key)
        if part:
            print(f"{key}: {part.get('headline') or part.get('skipped') or ''}")
