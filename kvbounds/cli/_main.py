"""Command line: ``kvbounds list | show CLAIM | check [CLAIM ...] | report [CLAIM ...] | evaluate SPEC``.

    kvbounds list [--out DIR]        every claim: id, kind, check, source, statement
    kvbounds show CLAIM [--out DIR]  one claim in full, with its last verdict from DIR's records
    kvbounds check [CLAIM ...]       run checks, appending records to DIR/results.jsonl
    kvbounds report [CLAIM ...]      DIR/report.html, DIR/summary.json, DIR/figures/ and a terminal summary
                    [--markdown FILE]  and a markdown summary (``make results-md``: docs/RESULTS.md)
    kvbounds evaluate SPEC           any press or compressor against the battery of controls at equal memory
"""
from __future__ import annotations

import argparse
import re
import sys
import textwrap

from kvbounds import __version__
from kvbounds.claims import CLAIMS, get_claim
from kvbounds.run import PROFILES
from kvbounds.core import ResultStore
from kvbounds.claims import cite, papers_in
from kvbounds.core import ResultStore, StoreError, StoreOfOtherCommand
from kvbounds.algorithms.arrays import BACKENDS, why_unavailable
from kvbounds.core import duration
from kvbounds.core import OutputRefused, check_output
from kvbounds.core import StoreError

WIDTH = 100


def _resolve(ids) -> list[str] | None:
    """Claim ids as registered (case-insensitive); prints the "did you mean" error and returns None if unknown."""
    out = []
    for cid in ids:
        try:
            out.append(get_claim(cid).id)
        except KeyError as e:
            print(f"kvbounds: {e.args[0]}", file=sys.stderr)
            return None
    return out


def _record_counts(out_dir) -> dict[str, int]:
    done: dict[str, int] = {}
    if out_dir:
        for r in ResultStore(out_dir).load():
            done[r.claim] = done.get(r.claim, 0) + 1
    return done


def _cmd_list(args) -> int:
    done = _record_counts(args.out)
    fams = list(dict.fromkeys(c.family for c in CLAIMS.values()))
    print(f"kvbounds {__version__}: {len(CLAIMS)} claims ({', '.join(fams)}). "
          "`kvbounds show CLAIM` prints one in full.\n")
    w = max(map(len, CLAIMS))
    cw = max(len(c.check.rsplit(".", 1)[-1]) for c in CLAIMS.values()) + (14 if done else 0)
    print(f"{'CLAIM':<{w}}  {'KIND':<18}  {'CHECK (proofs_checks/)' if not done else 'CHECK, RECORDS':<{cw}}  SOURCE")
    for c in CLAIMS.values():
        status = c.check.rsplit(".", 1)[-1] + ".py" if c.has_check else "no check yet"
        if done:
            status += f", {done.get(c.id, 0)} rec."
        print(f"{c.id:<{w}}  {c.kind:<18}  {status:<{cw}}  {c.source}")
        if not args.brief:
            print(textwrap.fill(c.statement, WIDTH, initial_indent=" " * (w + 2), subsequent_indent=" " * (w + 2)))
    return 0


def _cmd_show(args) -> int:
    ids = _resolve([args.claim])
    if ids is None:
        return 2
    from kvbounds.report import source_path
    c = CLAIMS[ids[0]]
    print(f"{c.id}  ({c.kind}; {c.family})\n")
    print(textwrap.fill(c.statement, WIDTH) + "\n")
    print(f"source:  {c.source}")
    for p in papers_in(c.source):
        print(textwrap.fill(p.citation(), WIDTH, initial_indent="         ", subsequent_indent="           "))
    print(f"bound:   {c.bound or '-'}  ({source_path(c.bound) or '-'})")
    print(f"check:   {c.check or '-'}  ({source_path(c.check) or '-'}){'' if c.has_check else '  [no check yet]'}")
    if c.has_check:
        from kvbounds.run import PROFILES, profile_trials
        mod = c.check_module()
        print("trials:  " + " · ".join(f"{p} {len(profile_trials(mod, p))}" for p in PROFILES))
    recs = [r for r in ResultStore(args.out).load() if r.claim == c.id]
    if not recs:
        print(f"verdict: not run (no records in {args.out}/results.jsonl; `kvbounds check {c.id} --out {args.out}`)")
        return 0
    from kvbounds.report import build_verdicts, dimensions, headline
    v = build_verdicts(recs, [c.id])[c.id]
    d = dimensions(v)
    print(f"verdict: {headline(v)}  ({', '.join(f'{k} {val}' for k, val in d.items() if val != 'n/a')}; "
          f"{len(recs)} records in {args.out})")
    print(textwrap.fill(cite(v.summary), WIDTH, initial_indent="         ", subsequent_indent="         "))
    if v.power_table:
        from kvbounds.battery import power_table_lines
        print("         against the battery at equal memory (the claim's metric, median over streams; calls: * better, "
              "+ leaning better, = tied, - leaning worse, ! worse, ? not attainable)")
        for line in power_table_lines(v.power_table):
            print("           " + line)
    for f in v.findings:
        print(textwrap.fill(f"- [{f.kind}] {cite(f.title)}", WIDTH, initial_indent="         ",
                            subsequent_indent="           "))
    if v.deferred:
        print(textwrap.fill(f"deferred: {v.deferred}", WIDTH, initial_indent="         ", subsequent_indent="           "))
    return 0


def _cuda_visible() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def _cmd_check(args) -> int:
    """Run the checks, then print the verdict of each claim run. Ctrl-C or SIGTERM: one line saying
    how to resume, exit 130 / 143. An unusable --out (read-only, a file, full disk, another `check`
    writing there): one line, exit 1; the trials already written stay valid."""
    from kvbounds.claims import checked_claims, get_claim
    from kvbounds.report import build_verdicts
    from kvbounds.run import Terminated, profile_trials, run_checks, sigterm_raises
    try:
        args.claims = [get_claim(cid).id for cid in args.claims]   # ids are case-insensitive
    except KeyError as e:
        print(f"kvbounds: {e.args[0]}", file=sys.stderr)
        return 2
    if not args.claims and args.profile == "gpu":   # the gpu profile holds the scale sweeps of a few checks only
        args.claims = [c.id for c in checked_claims() if profile_trials(c.check_module(), "gpu")]
    if args.backend in BACKENDS:                  # an unknown name is run_checks' error (exit 2 below)
        why = why_unavailable(args.backend)
        if why is not None:                       # refuse before any trial runs (not one error record per trial)
            print(f"kvbounds: --backend {args.backend} cannot run on this machine: {why}", file=sys.stderr)
            return 2
    if args.backend in ("torch:cuda", "cupy") or (args.backend == "torch" and _cuda_visible()):
        from kvbounds.gpu.support import describe    # which checks put their arrays on the device, which on the CPU
        for line in describe(args.claims or [c.id for c in checked_claims()], args.backend):
            print(line, file=sys.stderr)
    resume = f"finished trials are kept in {args.out}/results.jsonl; rerun the same command to resume"
    timings: dict = {}
    if args.scheduler is not None and args.workers is not None:
        print("kvbounds: --workers and --scheduler exclude each other (the cluster's workers run the trials; "
              "local:N sets their number)", file=sys.stderr)
        return 2
    try:
        with sigterm_raises(), _executor(args.scheduler) as (executor, workers):
            recs = run_checks(args.claims or None, profile=args.profile, seed=args.seed, backend=args.backend,
                              out=args.out, executor=executor, workers=workers or args.workers,
                              progress=not args.quiet, timings=timings)
    except KeyboardInterrupt:
        print(f"kvbounds: interrupted; {resume}", file=sys.stderr)
        return 130
    except Terminated:
        print(f"kvbounds: terminated; {resume}", file=sys.stderr)
        return 143
    except StoreOfOtherCommand as e:          # a `kvbounds evaluate` store: the wrong --out, refused before any trial
        print(f"kvbounds: {e}", file=sys.stderr)
        return 2
    except StoreError as e:
        print(f"kvbounds: error: {e}", file=sys.stderr)
        return 1
    except (ValueError, RuntimeError) as e:
        print(f"kvbounds: {e}", file=sys.stderr)
        return 2
    ids = list(dict.fromkeys(args.claims)) or [c.id for c in checked_claims()]
    store = ResultStore(args.out)
    contents = store.read()          # one pass over results.jsonl: records and error records together
    verdicts = build_verdicts([r for r in contents.records if r.claim in ids])
    width = max(map(len, ids))
    for cid in ids:
        v = verdicts[cid]
        text = f"{v.headline or v.status}: {' '.join(v.summary.split())}"
        print(f"{cid:<{width}}  {text[:110] + '...' if len(text) > 113 else text}")
        if v.deferred:
            print(f"{'':<{width}}  deferred: {v.deferred}")
    if timings.get("claims"):
        print(_timing_table(timings))
    errors = [e for e in contents.errors if e.claim in ids]
    failed = f"; {len(errors)} trial(s) failed with an error (retried by the next `check`)" if errors else ""
    print(f"kvbounds: wrote {len(recs)} record(s) to {store.path}{failed}; details: `kvbounds report --out {args.out}`")
    return 0


def _executor(scheduler: str | None):
    """``(executor, its workers)`` for ``--scheduler`` (a dask.distributed cluster, :mod:`kvbounds.run`), or
    ``(None, None)``: the runner's own process pool."""
    if scheduler is None:
        import contextlib
        return contextlib.nullcontext((None, None))
    from kvbounds.run import dask_executor
    return dask_executor(scheduler)


def _timing_table(run: dict) -> str:
    """This run's time per claim, slowest first: wall clock from its first trial's start to its last trial's end
    (claims overlap on several workers) and the seconds summed over its trials."""
    rows = sorted(run["claims"].items(), key=lambda kv: -kv[1]["cpu_s"])
    lines = [f"time of this run: wall {duration(run['wall_s'])}, {duration(run['cpu_s'])} summed over "
             f"{run['trials']} trial(s) on {run['workers']} worker(s); per claim (slowest first):"]
    lines += [f"  wall {duration(t['wall_s']):>7}, trials {duration(t['cpu_s']):>7}: {cid} ({t['trials']} trials)"
              for cid, t in rows]
    return "\n".join(lines)


def _cmd_report(args) -> int:
    """Exit 2 with one line, before anything is written, when an output path (``--markdown``, or report.html /
    summary.json as links) is a file the result store owns (kvbounds.core._output_files)."""
    from kvbounds.report import ReportError, build_verdicts, render_terminal, write_report
    claims = None
    if args.claims:
        claims = _resolve(args.claims)
        if claims is None:
            return 2
    try:
        if args.markdown:
            check_output(args.markdown, stores=[args.out])
        html = write_report(args.out, claims)
    except (ReportError, OutputRefused) as e:
        print(f"kvbounds: {e}", file=sys.stderr)
        return 2
    except OSError as e:           # read-only or full output directory: one line, not a traceback
        where = f" ({e.filename})" if e.filename else ""
        print(f"kvbounds: error: cannot write the report in {args.out}{where}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(render_terminal(build_verdicts(ResultStore(args.out).load(), claims)))
    print(f"report: {html}")
    if args.markdown:
        from kvbounds.report.markdown import write_markdown
        try:
            print(f"markdown: {write_markdown(args.out, args.markdown, claims)}")
        except OutputRefused as e:
            print(f"kvbounds: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            print(f"kvbounds: cannot write {args.markdown}: {e.strerror or e}", file=sys.stderr)
            return 1
    return 0


# an example per command, shown under its --help (argparse's epilog)
EXAMPLES = {
    "list": "kvbounds list --brief\nkvbounds list --out results      # with each claim's record count",
    "show": "kvbounds show BKV.attention",
    "check": "kvbounds check --profile smoke SBW.balance\nkvbounds check --out results     # every claim, quick profile",
    "report": "kvbounds report --out results --markdown RESULTS.md",
    "traces": "kvbounds traces extract --model smollm2 --tokens 2048\nkvbounds traces list",
    "extract": "kvbounds traces extract --model minilm --tokens 512 --layers 0,3",
    "e2e": "kvbounds e2e --methods balancekv streaming_llm uniform --budgets 0.25 --tasks passkey --instances 4",
    "evaluate": "kvbounds evaluate kvpress:SnapKVPress --profile smoke\nkvbounds evaluate mymodule:MyPress --e2e",
}
OPTION_HELP = {"--out": "the output directory (the record store)", "--seed": "the base random seed",
               "--quiet": "no progress lines", "--cache-dir": "cache root (default: $KVBOUNDS_CACHE or "
               "~/.cache/kvbounds)", "claim": "a claim id (kvbounds list names them)",
               "--model": "the model to read", "claims": "claim ids (default: all)",
               "--profile": "the trials' sizes: smoke (seconds), quick (the main job), full"}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Description and examples as written; each option's default appended where its help does not say it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default is not None and action.default is not False and action.default != argparse.SUPPRESS \
                and action.option_strings and "default" not in text:
            text += " (default: %(default)s)"
        return text


def plain(doc: str) -> str:
    """A docstring without reST markup (``code`` -> code), for --help."""
    return re.sub(r"``([^`]*)``", r"\1", doc or "")


def finish_help(parser: argparse.ArgumentParser, name: str = "kvbounds") -> None:
    """Every subcommand with an example (:data:`EXAMPLES`) and every option with help (:data:`OPTION_HELP` where its
    module gave none) and its default, recursively."""
    parser.formatter_class = HelpFormatter
    parser.description = plain(parser.description)
    if name in EXAMPLES:
        parser.epilog = "example:\n" + textwrap.indent(EXAMPLES[name], "  ")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                finish_help(sub, sub_name)
        elif action.help is None:
            key = action.option_strings[0] if action.option_strings else action.dest
            action.help = OPTION_HELP.get(key, "")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvbounds", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=f"kvbounds {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("list", help="list the registered claims with their statements")
    pl.add_argument("--out", default=None, help="also count records in DIR/results.jsonl")
    pl.add_argument("--brief", action="store_true", help="one line per claim, no statements")
    ps = sub.add_parser("show", help="one claim in full: statement, source, bound, check, last verdict")
    ps.add_argument("claim", metavar="CLAIM_ID")
    ps.add_argument("--out", default="results", help="read the last verdict from DIR/results.jsonl")
    pc = sub.add_parser("check", help="run claim checks, appending records to DIR/results.jsonl")
    pc.add_argument("claims", nargs="*", metavar="CLAIM_ID")
    pc.add_argument("--profile", choices=PROFILES, default="quick",
                    help="smoke | quick (the main job) | full | gpu (the scale sweeps of SB.discrepancy, MR.error and "
                         "BKV.memory; on a CPU backend their largest trials are deferred)")
    pc.add_argument("--backend", default="numpy", help="numpy | torch | torch:cpu | torch:cuda | cupy")
    pc.add_argument("--seed", type=int, default=0, help="the base random seed (each trial's seed derives from it)")
    pc.add_argument("--out", default="results", help="the record store: DIR/results.jsonl is appended to")
    pc.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    pc.add_argument("--scheduler", default=None, metavar="ADDRESS|local:N",
                    help="run the trials on a dask.distributed cluster: a scheduler's address (tcp://host:8786; its "
                         "workers one thread each) or local:N (a local cluster of N worker processes); needs the dask "
                         "extra")
    pc.add_argument("--quiet", action="store_true", help="no progress lines")
    pr = sub.add_parser("report", help="turn the records into report.html + figures + terminal summary")
    pr.add_argument("claims", nargs="*", metavar="CLAIM_ID", help="only these claims (default: all)")
    pr.add_argument("--out", default="results", help="the record store to read; report.html and summary.json go there")
    pr.add_argument("--markdown", metavar="FILE", default=None,
                    help="also write a markdown summary (verdict matrix, findings, every claim's verdict) to FILE")
    traces_cli = _traces_cli()
    if traces_cli is not None:
        traces_cli.add_parser(sub)          # `kvbounds traces extract ...` (real Q/K/V from real models)
    from . import _e2e as e2e_cli      # `kvbounds e2e ...` (end-to-end harness; needs the hf extra to run)
    e2e_cli.add_parser(sub)
    from . import _evaluate as evaluation_cli   # `kvbounds evaluate SPEC` (any press or compressor against the battery)
    evaluation_cli.add_parser(sub)
    finish_help(p)
    return p


def _traces_cli():
    import importlib.util
    if importlib.util.find_spec("kvbounds.traces.cli") is None:
        return None
    import kvbounds.traces.cli
    return kvbounds.traces.cli


def main(argv=None) -> int:
    try:
        return _main(argv)
    except StoreError as e:        # a store that cannot be read (results.jsonl a FIFO, a link out of the store): one line
        print(f"kvbounds: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:        # `kvbounds list | head`: the reader left; stop quietly (Python's SIGPIPE recipe)
        import os
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "traces":
        return _traces_cli().run(args)
    if args.cmd == "e2e":
        from . import _e2e as e2e_cli
        return e2e_cli.run(args)
    if args.cmd == "evaluate":
        from . import _evaluate as evaluation_cli
        return evaluation_cli.run(args)
    return {"list": _cmd_list, "show": _cmd_show, "check": _cmd_check, "report": _cmd_report}[args.cmd](args)
