"""``kvbounds e2e``: the end-to-end harness on any Llama-family model, writing resumable records like ``check``.

    kvbounds e2e [--model smollm2|PATH_OR_HF_ID] [--device cpu|cuda] [--where host|device] [--methods ...] [--budgets ...]
                 [--tasks ppl passkey lines] [--n 512] [--instances 8] [--out DIR]

Trials are those of the checks ``BKV.e2e`` (ppl, passkey) and ``SG.e2e`` (lines) with the given model, device,
methods and budgets; a trial whose records are already in DIR/results.jsonl is skipped. The model is loaded
once, offline (a local path or an HF id already in the local cache). Prints the leaderboard. Bad arguments
(:func:`problems`: also a --model path that is no model, and --n beyond the model's context, read from its
configuration) exit with 2 and one line each before any work; repeated --methods / --budgets run once; records are
written under the output directory's lock, as ``check`` writes them.
"""
from __future__ import annotations

import sys
from kvbounds.core import ResultStore, StoreError
from kvbounds.core import ResultStore

# the RULER-style tasks (kvbounds.e2e.ruler.KINDS), named here so that the parser does not import the harness
RULER = ["niah_single", "niah_multikey", "niah_multivalue", "vt", "cwe"]


def add_parser(sub) -> None:
    from kvbounds import e2e as M      # names only: `kvbounds --version` must not load the compressors
    p = sub.add_parser("e2e", help="end-to-end: every compressor inside a real model (perplexity, passkey, lines)")
    p.add_argument("--model", default="smollm2",
                   help="smollm2 (offline GGUF), qwen2.5-coder-0.5b (the second offline model; alias qwen), a local "
                        "GGUF file, or a local folder / cached HF id")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--where", default="host", choices=["host", "device"],
                   help="where our methods compress: host (numpy, float32 copies; the checks' default) or device "
                        "(torch tensors on --device, the cache stays there)")
    p.add_argument("--methods", nargs="+", default=list(M.DEFAULT_METHODS), metavar="METHOD",
                   help=f"ours: {' '.join(M.OURS)}; kvpress: {' '.join(M.KVPRESS)}; or any registered method (a "
                        "third party's, through the entry-point group kvbounds.methods)")
    p.add_argument("--budgets", nargs="+", type=float, default=[0.25, 0.5],
                   help="fractions of the cache's floats, in (0, 1]; every method holds within 1%% of it")
    p.add_argument("--tasks", nargs="+", default=["ppl", "passkey", "lines"], choices=["ppl", "passkey", "lines"] + RULER,
                   help="ppl, passkey, lines, and the RULER-style tasks (kvbounds.e2e.ruler)")
    p.add_argument("--setting", default="after", choices=["after", "inside", "both"],
                   help="passkey/lines: question after the compressed prompt (after), or inside it with blocks of "
                        "128 (inside: the papers' LongBench setting), or both")
    p.add_argument("--n", type=int, default=512, help="context length in tokens")
    p.add_argument("--instances", type=int, default=8, help="instances (windows, passkeys, line sets) per task")
    p.add_argument("--window", type=int, default=32, help="first and last tokens kept exactly")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results")


def problems(args) -> list[str]:
    """What is wrong with ``kvbounds e2e``'s arguments, one line each (empty when nothing): checked before any
    work (no model loaded, no record written)."""
    import os
    from kvbounds import e2e as M
    from kvbounds.e2e import budget_problem
    out = []
    for name in ("n", "instances"):
        if getattr(args, name) < 1:
            out.append(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.window < 0:
        out.append(f"--window must be >= 0, got {args.window}")
    if not out and 2 * args.window >= args.n:
        out.append(f"--n {args.n} is too small for sink + window = {args.window} + {args.window} (need n > "
                   f"{2 * args.window})")
    if not out:
        out += sorted({f"--budgets: {p}" for b in args.budgets
                       if (p := budget_problem(args.n, 64, args.window, args.window, b))})
    from kvbounds.methods import names
    unknown = [m for m in args.methods if m not in M.DEFAULT_METHODS and m not in names()]
    if unknown:
        external = names(source="external")
        out.append(f"--methods: unknown {', '.join(map(repr, unknown))}; ours: {' '.join(M.OURS + M.CONTROLS)}; "
                   f"kvpress: {' '.join(M.KVPRESS)}" + (f"; others registered: {' '.join(external)}" if external else ""))
    from kvbounds.traces import qwen
    if args.model != "smollm2" and not qwen.is_name(args.model) and not os.path.exists(args.model) \
            and not _in_hf_cache(args.model):
        out.append(f"--model {args.model!r} does not exist (not a local path, not a model in the local "
                       "Hugging Face cache; the harness loads offline)")
    elif args.n >= 1:
        out += _context_problems(args)
    dev = args.device
    if dev != "cpu" and not (dev == "cuda" or dev.startswith("cuda:") and dev[5:].isdigit()):
        out.append(f"--device must be cpu, cuda or cuda:<index>, got {dev!r}")
    elif dev.startswith("cuda"):
        try:
            import torch
            ok = torch.cuda.is_available()
        except ImportError:
            ok = False
        if not ok:
            out.append(f"--device {dev}: CUDA is not available on this machine (use --device cpu)")
    return out


TAIL = 64      # tokens the tasks read after the n of context: the perplexity continuation (questions are shorter)


def _context_problems(args) -> list[str]:
    """--model that is not a model, and --n beyond the model's context (read from its configuration)."""
    from kvbounds.e2e import model_context
    try:
        ctx, where = model_context(args.model)
    except ValueError as e:
        return [f"--model {e}"]
    except Exception as e:  # noqa: BLE001 - a model package that cannot be read is said, in one line
        return [f"--model {args.model!r}: cannot read its configuration ({type(e).__name__}: {e})"[:300]]
    if ctx is not None and args.n + TAIL > ctx:
        return [f"--n {args.n} is beyond the model's context of {ctx} tokens ({where}): the tasks read up to "
                f"{TAIL} tokens after the context, so --n must be <= {ctx - TAIL}"]
    return []


def _in_hf_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:   # noqa: BLE001 - an id the hub library rejects is not in the cache
        return False


def _missing_requirements(model: str) -> str | None:
    """Why the harness cannot run here, in one line (a package of the ``hf`` extra or SmolLM2's model file is not
    installed), or None: checked before any work, so a missing package is one line, not a traceback."""
    import importlib.util
    from kvbounds.traces import qwen
    from kvbounds.traces.hf_capture import ModelUnavailable
    if qwen.is_name(model):
        return qwen.available()
    need = ("torch", "transformers") + (("gguf", "tokenizers") if model == "smollm2" else ())
    missing = [m for m in need if importlib.util.find_spec(m) is None]
    if missing:
        return f"needs the Python package(s) {', '.join(missing)}: pip install 'kvbounds[hf]'"
    if model == "smollm2":
        from kvbounds.traces.smollm2 import model_file
        try:
            model_file()
        except ModelUnavailable as e:
            return str(e)
    return None


def dedupe(args) -> list[str]:
    """Remove repeated --methods / --budgets entries (one measurement is stored once); the notes to print."""
    notes = []
    for name in ("methods", "budgets"):
        given = getattr(args, name)
        kept = list(dict.fromkeys(given))
        if len(kept) < len(given):
            again = sorted({str(x) for x in given if given.count(x) > 1})
            notes.append(f"--{name}: {', '.join(again)} given more than once; each is run once")
            setattr(args, name, kept)
    return notes


def run(args) -> int:
    from kvbounds.traces import qwen
    from kvbounds.traces.hf_capture import ModelUnavailable
    if qwen.is_name(args.model):
        args.model = qwen.NAME          # one name in the records, whichever alias was given
    for note in dedupe(args):
        print(f"kvbounds e2e: {note}", file=sys.stderr)
    why = _missing_requirements(args.model)     # first: the argument checks read the model's configuration
    if why is not None:
        print(f"kvbounds e2e: {why}", file=sys.stderr)
        return 2
    bad = problems(args)
    if bad:
        for line in bad:
            print(f"kvbounds e2e: {line}", file=sys.stderr)
        return 2
    try:
        with ResultStore(args.out, writer="check").lock():     # `e2e` writes claim records, as `check` does
            return _run(args)
    except StoreError as e:       # StoreLocked included: another `kvbounds check` / `e2e` writes to --out
        print(f"kvbounds e2e: {e}", file=sys.stderr)
        return 2
    except ModelUnavailable as e:  # a reader of the model file missing or broken (found when the model loads)
        print(f"kvbounds e2e: {e}", file=sys.stderr)
        return 2


def _run(args) -> int:
    from kvbounds.run import Trial, execute_trial
    from kvbounds.e2e import profile_grid
    from kvbounds.e2e import leaderboard_rows, timing_rows
    store = ResultStore(args.out)
    done = store.done_keys()
    trials = []
    for claim, kinds in (("BKV.e2e", ("ppl", "passkey", *RULER)), ("SG.e2e", ("lines",))):
        spec = {k: ((args.n, args.instances, 64) if k == "ppl" else (args.n, args.instances)) for k in kinds
                if k in args.tasks}
        for p in profile_grid("custom", spec, methods=args.methods, budgets=args.budgets, sink=args.window,
                              window=args.window, model=args.model, device=args.device, where=args.where,
                              settings=("after", "inside") if args.setting == "both" else (args.setting,)):
            trials.append(Trial(claim, p, args.seed, "torch:" + args.device))
    todo = list({t.key: t for t in trials if t.key not in done}.values())     # one trial per key
    print(f"kvbounds e2e: {len(trials)} trial(s), {len(trials) - len(todo)} already in {args.out}", file=sys.stderr)
    for i, t in enumerate(todo):
        recs = execute_trial(t)
        store.append(recs)
        print(f"  [{i + 1}/{len(todo)}] {t.claim} {t.params['task']} #{t.params['index']}: {len(recs)} record(s)",
              file=sys.stderr)
    recs = [r for r in store.load() if r.claim in ("BKV.e2e", "SG.e2e")]
    rows = leaderboard_rows(recs)
    print_board(rows, recs)
    print("\nseconds per method per window (compress, score; CPU seconds on a CPU, wall seconds on a GPU):")
    for t in timing_rows(recs):
        print(f"  {t['method']:28s} n={t['n']:<5d} compress {t['compress_s']:.3f}  score {t['score_s']:.3f}  "
              f"(prefill {t['prefill_s']:.2f}, shared)")
    return 0


def print_board(rows, records=()) -> None:
    """The leaderboard as ranked tables (one per metric and budget), the collapsed ones as one line each, and
    the budget at which each method first retrieves."""
    from kvbounds.report import board_table
    from kvbounds.e2e import first_retrieval
    t = board_table(rows)
    for line in t["references"]:
        print(f"reference: {line}")
    for tab in t["tables"]:
        print(f"\n{tab['title']}")
        print(f"  {'#':>2s} {'method':26s} {'family':9s} {'value':>9s}  {'95% CI':22s} {'n':>3s} {'floats':>11s}")
        for r in tab["rows"]:
            print(f"  {r['rank']!s:>2s} {r['method']:26s} {r['family']:9s} {r['text']:>9s}  {r['ci']:22s} {r['n']!s:>3s} "
                  f"{r['floats']:>11s}  {r['mark']}")
    for line in t["collapsed"]:
        print(line)
    for task, by in first_retrieval(records).items():
        print(f"\n{task}: first budget at which each method retrieves: " + ", ".join(
            f"{m} {'never' if b is None else f'{100 * b:.3g}%'}" for m, b in by.items()))
