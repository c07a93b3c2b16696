"""Command-line interface: ``cosycompile build|plan|init-model|cache ...``.

Bad input exits with status 2 and one line on stderr; nothing heavy (torch, runtimes) is
imported unless a step actually has to run.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from cosycompile import __version__
from cosycompile.errors import UserError

EXIT_SPLIT = 3  # a split build: every step this machine can run is cached, the rest is listed

EPILOG = """\
examples:
  cosycompile build recipes/cpu-fp32.yaml          build, validate and bundle a recipe
  cosycompile plan recipes/cpu-fp32.yaml           show what would run and why (no work)
  cosycompile init-model builtin:tiny --out m/     write a built-in model as a checkpoint dir
  cosycompile cache verify --full                  re-hash every cache entry
  cosycompile build R.yaml --cache-remote s3://bucket/cosy   share steps through an S3-compatible store
  cosycompile cache push BUNDLE --cache-remote URL  upload the cache entries a bundle was built from
  cosycompile pack BUNDLE -o bundle.tar.gz         one verified archive of a bundle
  cosycompile unpack bundle.tar.gz DIR             unpack it on another machine (all or nothing)
  cosycompile synthesize DIR --text "Hello." --out hello.wav   text -> wav with the bundle alone
  cosycompile triton DIR --out repo/                Triton model repository of a bundle

exit status: 0 success, 1 a check or build step failed, 2 bad input (recipe, model, data, paths),
  3 built in part: the steps this machine cannot run (e.g. a GPU engine builder that is not installed)
  are listed with the command that finishes them elsewhere
"""


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--artifacts", type=Path, default=Path("artifacts"), metavar="DIR",
                   help="cache and build output folder (default: ./artifacts)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the result")


def _add_remote(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-remote", metavar="URL", default=None,
                   help="shared remote cache, e.g. s3://bucket/prefix or file:///shared/cache (default: "
                        "$COSYCOMPILE_CACHE_REMOTE; '' for none). Missing steps are pulled and verified, built "
                        "steps pushed; S3 credentials and endpoint come from the AWS environment "
                        "(AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL_S3, ...)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cosycompile",
        description="Build CosyVoice2 into validated, cached engines (ONNX Runtime, TensorRT, TensorRT-LLM).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cosycompile {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("build", help="run a recipe: export, simplify, build engines, check, bundle",
                       description="Run every step of RECIPE whose output is not already cached, then "
                                   "write the bundle builds/<name>-<key12>/ and print its report.")
    p.add_argument("recipe", type=Path, help="recipe YAML file")
    p.add_argument("--force", action="store_true", help="re-run every step even if cached")
    p.add_argument("--until", choices=("export", "simplify", "quantize", "engine", "check"),
                   help="stop after this step of every stage (no pipeline check, no bundle); e.g. "
                        "--until quantize builds a GPU recipe's checkpoints and ONNX on a CPU machine")
    p.add_argument("--allow-unvalidated", action="store_true",
                   help="pass the gate for engines this machine cannot run (the bundle says 'built, not validated "
                        "here'; run `cosycompile validate BUNDLE` on a machine that can)")
    _add_common(p)
    _add_remote(p)

    p = sub.add_parser("plan", help="show the steps of a recipe, their keys, and which would run and why",
                       description="Work out every step's content key and compare with the cache. No work is done.")
    p.add_argument("recipe", type=Path, help="recipe YAML file")
    p.add_argument("--force", action="store_true", help="plan as if --force were given to build")
    p.add_argument("--todo", action="store_true",
                   help="list only the steps that would run (after a split build: the ones left)")
    p.add_argument("--json", action="store_true",
                   help="with --todo: print the steps that would run as one JSON object (name, kind, key, why, "
                        "and what each needs: target, backend, blocked here and why) for an orchestrator")
    _add_common(p)
    _add_remote(p)

    p = sub.add_parser("init-model", help="write a built-in model as a checkpoint dir of its family",
                       description="Write builtin:tiny or builtin:random-0.5b in the real layout of its model "
                                   "family (CosyVoice2: cosyvoice2.yaml, llm.pt, flow.pt, hift.pt, "
                                   "CosyVoice-BlankEN/, front-end ONNX).")
    p.add_argument("spec", help="builtin:tiny or builtin:random-0.5b")
    p.add_argument("--out", type=Path, required=True, help="output folder (must not exist or be empty)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")

    p = sub.add_parser("gate", help="pass/fail a bundle on quality and speed (exit 0 pass, 1 regression, 2 bad input)",
                       description="Apply the bundle recipe's validation.gate thresholds, and optionally compare "
                                   "against a baseline report: quality may drop by at most --max-quality-drop "
                                   "(relative), speed-ups may shrink by at most --max-slowdown (relative).")
    p.add_argument("bundle", type=Path, nargs="?", help="bundle dir or report.json")
    p.add_argument("--baseline", type=Path, help="baseline bundle dir or report.json")
    p.add_argument("--max-quality-drop", type=float, default=None, help="relative, e.g. 0.05 = 5%% (default: recipe's)")
    p.add_argument("--max-slowdown", type=float, default=None, help="relative, e.g. 0.25 = 25%% (default: recipe's)")
    p.add_argument("--list-metrics", action="store_true", help="list the metric names a gate can use")
    p.add_argument("--allow-unvalidated", action="store_true",
                   help="pass a bundle whose engines were built but not validated (no check could run)")

    p = sub.add_parser("validate", help="run the checks of a bundle on its own engines (on a machine that can run them)",
                       description="Validate BUNDLE's engines against the PyTorch FP32 reference, as a build would, "
                                   "and write a validated bundle. Needs the bundle's recipe (recorded in its manifest, "
                                   "or --recipe) and its model and eval set.")
    p.add_argument("bundle", type=Path, help="bundle dir")
    p.add_argument("--recipe", type=Path, help="the recipe file, if not where the manifest says")
    p.add_argument("--force", action="store_true", help="re-run every step even if cached")
    _add_common(p)

    p = sub.add_parser("report", help="re-render a bundle's report.md (and plot) from its report.json")
    p.add_argument("bundle", type=Path, help="bundle dir")

    p = sub.add_parser("compare", help="print two builds' metrics side by side")
    p.add_argument("a", type=Path, help="bundle dir or report.json")
    p.add_argument("b", type=Path, help="bundle dir or report.json")

    p = sub.add_parser("cache", help="inspect or check the local cache")
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION")
    v = csub.add_parser("verify", help="check every entry against its digests; remove bad ones")
    v.add_argument("--full", action="store_true", help="re-hash every file, not only changed ones")
    _add_common(v)
    ls = csub.add_parser("ls", help="list cache entries")
    _add_common(ls)
    gc = csub.add_parser("gc", help="remove entries no bundle under builds/ needs, least recently used first",
                         description="Remove cache entries that no bundle under <artifacts>/builds was made from: "
                                     "those unused for longer than --older-than, then the least recently used "
                                     "until the cache fits --max-size. Entries of kept bundles always stay. "
                                     "Staging dirs left by killed builds are removed too.")
    gc.add_argument("--max-size", metavar="SIZE", help="largest total size to keep, e.g. 20G, 500M")
    gc.add_argument("--older-than", metavar="AGE", help="remove entries unused for longer than this, e.g. 30d, 12h")
    gc.add_argument("--dry-run", action="store_true", help="print what would be removed, remove nothing")
    _add_common(gc)
    push = csub.add_parser("push", help="upload a bundle's cache entries to the remote cache",
                           description="Push every cache entry BUNDLE was built from (its manifest's steps) to the "
                                       "remote cache: blobs the remote lacks, then each action entry unless the "
                                       "remote already has one for that key (the first writer wins).")
    push.add_argument("bundle", type=Path, help="bundle dir (builds/<name>-<key12>/)")
    _add_common(push)
    _add_remote(push)
    pull = csub.add_parser("pull", help="download a bundle's (or one key's) cache entries from the remote cache",
                           description="Pull the cache entries BUNDLE was built from (or the entry of KEY) into the "
                                       "local cache, verifying every blob, so later builds reuse them.")
    pull.add_argument("what", metavar="BUNDLE-or-KEY", help="bundle dir, or a full 64-hex step key")
    _add_common(pull)
    _add_remote(pull)

    p = sub.add_parser("pack", help="pack a bundle into one deterministic .tar.gz (every file checked against "
                                    "manifest.json)",
                       description="Write BUNDLE as one .tar.gz: the bundle's folder with manifest.json first, then "
                                   "every file it lists in sorted order, with fixed metadata (the same bundle gives "
                                   "the same bytes). A bundle whose files do not match their digests is refused.")
    p.add_argument("bundle", type=Path, help="bundle dir (builds/<name>-<key12>/)")
    p.add_argument("-o", "--out", type=Path, required=True, metavar="FILE", help="archive to write (.tar.gz)")

    p = sub.add_parser("unpack", help="unpack a bundle archive into DIR, verifying every digest (all or nothing)",
                       description="Extract FILE into DIR (must not exist, or be empty). Refuses links, devices, "
                                   "paths leaving DIR and files not in the manifest, checks every digest, and leaves "
                                   "DIR untouched on any refusal.")
    p.add_argument("archive", type=Path, metavar="FILE", help="archive written by cosycompile pack")
    p.add_argument("dir", type=Path, metavar="DIR", help="folder to create (or an empty one)")

    p = sub.add_parser("synthesize", help="text -> wav on a CPU bundle alone (no torch, no model dir)",
                       description="Synthesize TEXT with the bundle's engines and front end. Long texts are split "
                                   "into sentences and synthesized piece by piece with the same prompt. Sampling "
                                   "defaults are the recipe's validation.sampling.")
    p.add_argument("bundle", type=Path, help="bundle dir (a build's, or one from cosycompile unpack)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="text to say")
    src.add_argument("--text-file", type=Path, metavar="FILE", help="UTF-8 file with the text to say")
    p.add_argument("--prompt-wav", type=Path, metavar="WAV", help="zero-shot prompt audio (the voice to imitate)")
    p.add_argument("--prompt-text", metavar="TEXT", help="what the prompt audio says (needs --prompt-wav)")
    p.add_argument("--seed", type=int, default=None, help="sampling and vocoder seed of the first piece; piece k "
                                                          "uses SEED+k (default: the recipe's sampling seed)")
    p.add_argument("--sampling", choices=("greedy", "ras"), default=None,
                   help="speech-token sampling (default: the recipe's validation.sampling.mode)")
    p.add_argument("--max-tokens", type=int, default=None, metavar="N",
                   help="cap on speech tokens per piece, 0 for none (default: the recipe's)")
    p.add_argument("--max-chars", type=int, default=80, metavar="N",
                   help="longest piece in English-character equivalents; a CJK character counts 3 (default 80)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="intra-op threads of the engines (default: the recipe's validation.speed.threads)")
    p.add_argument("--out", type=Path, required=True, metavar="WAV", help="wav file to write (PCM16 at the model's sample rate)")

    p = sub.add_parser("triton", help="write a Triton Inference Server model repository of a bundle",
                       description="Write DIR as a Triton model repository serving BUNDLE. A CPU bundle (every "
                                   "stage on onnxruntime) gives python-backend models running its engines: "
                                   "FAMILY (decoupled, gRPC streaming, one response per text piece) and "
                                   "FAMILY_offline (HTTP), FAMILY the bundle's model family (cosyvoice2, "
                                   "cosyvoice3). A GPU bundle (llm trtllm, flow/hift tensorrt) gives "
                                   "the CosyVoice runtime layout: BLS FAMILY and FAMILY_offline, token2wav, vocoder, "
                                   "speaker_embedding, audio_tokenizer and tensorrt_llm (or --llm-url). Configs come "
                                   "from the bundle's manifest and recipe; DIR/README.md says how to start the server.")
    p.add_argument("bundle", type=Path, help="bundle dir (a build's, or one from cosycompile unpack)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="repository folder to create (must not exist, or be empty)")
    p.add_argument("--instances", type=int, default=1, metavar="N", help="instances per model (default 1)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="intra-op threads per CPU instance (default: the recipe's validation.speed.threads)")
    p.add_argument("--max-chars", type=int, default=80, metavar="N",
                   help="longest text piece in English-character equivalents, as for synthesize (default 80)")
    p.add_argument("--llm-url", metavar="URL",
                   help="GPU bundles: call a trtllm-serve at URL (TensorRT-LLM > 1.2 has no Triton backend) "
                        "instead of generating a tensorrt_llm model")
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so it unwinds as Ctrl-C does (staging dirs removed)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cosycompile`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _dispatch(args, parser)
    except UserError as exc:
        print(f"cosycompile: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        how, status = ("terminated", 143) if isinstance(exc, Terminated) else ("interrupted", 130)
        print(f"cosycompile: {how}; finished steps stay cached, the running one was discarded", file=sys.stderr)
        return status


def _dispatch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.command in ("build", "plan"):
        return _build_or_plan(args)
    if args.command == "init-model":
        return _init_model(args)
    if args.command == "cache":
        return _cache(args, parser)
    if args.command == "gate":
        return _gate(args)
    if args.command == "validate":
        return _validate(args)
    if args.command == "report":
        return _report(args)
    if args.command == "compare":
        return _compare(args)
    if args.command == "pack":
        from cosycompile.commands import pack

        return pack.run(args)
    if args.command == "unpack":
        from cosycompile.commands import unpack

        return unpack.run(args)
    if args.command == "synthesize":
        from cosycompile.commands import synthesize

        return synthesize.run(args)
    if args.command == "triton":
        from cosycompile.commands import triton

        return triton.run(args)
    parser.error(f"unknown command {args.command}")
    return 2


def _build_or_plan(args: argparse.Namespace) -> int:
    from cosycompile.exporters.bundle.export import bundle_dir
    from cosycompile.plan import executor, plan_build
    from cosycompile.cache.local import Store
    from cosycompile.core.graph import Reporter
    from cosycompile.cache.remote import remote_from
    from cosycompile.recipe.schema import load_recipe

    t0 = time.perf_counter()
    remote = remote_from(args.cache_remote)  # a mistyped URL is refused before any work
    recipe = load_recipe(args.recipe)
    g = recipe.validation.gate
    if g.baseline:
        from cosycompile.validate.gate import load_report

        load_report(recipe.resolve_path(g.baseline))  # read before any work: the gate compares with it last
    until = getattr(args, "until", None)
    plan = plan_build(recipe, until=until)
    store = Store(args.artifacts)
    reporter = Reporter(quiet=args.quiet)
    # `plan` never asks the remote: a lookup per missing step could wait on a silent server, and
    # the plan is only a forecast (a build pulls whatever the remote holds when it runs).
    ex = executor(plan, store, reporter, force=args.force, remote=remote if args.command == "build" else None)
    if args.command == "plan":
        if args.json and not args.todo:
            raise UserError("plan --json lists the steps that would run: give it with --todo")
        items = ex.plan()
        if args.json:
            import json

            from cosycompile.core.targets import TARGETS
            from cosycompile.split import todo_json

            print(json.dumps(todo_json(recipe, items, TARGETS[recipe.target]), indent=1))
            return 0
        w = max(len(i.step.name) for i in items)
        todo = sum(not i.cached for i in items)
        n_left = sum(i.left for i in items)
        here = f" ({n_left} of them not on this machine)" if n_left else ""
        print(f"recipe {recipe.name} ({recipe.source}): {len(items)} steps, {todo} to run{here}")
        for i in items:
            if i.cached and args.todo:
                continue
            state = "cached" if i.cached else "remote" if i.remote else "LEFT  " if i.left else "RUN   "
            why = "" if i.cached else f"  because: {i.reason}"
            print(f"  {state} {i.step.name:<{w}}  {i.key[:12]}  {i.step.describe}{why}")
        if remote is not None and todo:
            print(f"remote cache {remote.url}: not asked (plan makes no network call); a build pulls the steps "
                  "it holds instead of running them")
        print(f"bundle: {bundle_dir(plan, store)}")
        return 0
    result = ex.run()
    if result.pulled:
        print(f"pulled from the remote cache: {', '.join(result.pulled)}")
    if result.left:
        return _split_build(args, recipe.name, result, time.perf_counter() - t0, remote)
    if until is not None:
        ran = ", ".join(result.ran) if result.ran else "nothing (all cached)"
        print(f"built {recipe.name} until '{until}' in {time.perf_counter() - t0:.1f}s; ran: {ran}")
        for s in plan.steps:
            print(f"  {s.name}: {result.entries[s.name].data}")
        return 0
    from cosycompile.exporters import exporter_infos

    outputs = {name: exporter_infos()[name].hook("export")(plan, store, result) for name in recipe.exports}
    bundle = outputs.get("bundle") or exporter_infos()["bundle"].hook("export")(plan, store, result)
    dt = time.perf_counter() - t0
    report = bundle / "report.md"
    if report.is_file() and not args.quiet:
        print(report.read_text())
    ran = ", ".join(result.ran) if result.ran else "nothing (all cached)"
    print(f"built {recipe.name} in {dt:.1f}s; ran: {ran}")
    print(f"bundle: {bundle}")
    g = recipe.validation.gate
    baseline = recipe.resolve_path(g.baseline) if g.baseline else None
    th = g.thresholds()
    return _apply_gate(bundle, baseline, th["min"], th["max"], g.max_quality_drop, g.max_slowdown,
                       args.allow_unvalidated)


def _split_build(args: argparse.Namespace, name: str, result: Any, seconds: float, remote: Any = None) -> int:
    """Exit 3: what this machine could build is cached; say which steps are left and the command that
    finishes them on the other machine (``split.finish_command``: keeps the remote, names no path of
    this machine's that the other lacks)."""
    from cosycompile.split import finish_command

    ran = ", ".join(result.ran) if result.ran else "nothing (all cached)"
    print(f"built {name} in part in {seconds:.1f}s; ran: {ran}")
    print(f"{len(result.left)} steps left for a machine that can run them:")
    for step, why in result.left.items():
        print(f"  {step}: {why}")
    cmd, plan, needs = finish_command(args.recipe, args.artifacts, remote.url if remote is not None else None,
                                      until=getattr(args, "until", None), allow_unvalidated=args.allow_unvalidated)
    print(f"finish with: {cmd}\n"
          f"  on a machine that has what is named above ({needs}); `{plan}` lists them")
    return EXIT_SPLIT


def _validate(args: argparse.Namespace) -> int:
    from cosycompile.core.graph import Reporter
    from cosycompile.commands.validate import validate_bundle

    bundle, recipe = validate_bundle(args.bundle, args.artifacts, Reporter(quiet=args.quiet), args.recipe, args.force)
    print(f"validated: {bundle}")
    g = recipe.validation.gate
    th = g.thresholds()
    return _apply_gate(bundle, None, th["min"], th["max"], g.max_quality_drop, g.max_slowdown)


def _apply_gate(bundle: Path, baseline: Path | None, minimum: dict, maximum: dict, max_drop: float,
                max_slowdown: float, allow_unvalidated: bool = False) -> int:
    from cosycompile.validate.gate import check_baseline, check_thresholds, findings_table, load_report

    report = load_report(bundle)
    if report.get("validated") is False:
        why = "; ".join(f"{s}: {r}" for s, r in report.get("not_validated", {}).items())
        if allow_unvalidated:
            print(f"gate: PASS (built, not validated here: {why}; --allow-unvalidated)")
            return 0
        print(f"gate: FAIL (built, not validated here: {why}); run `cosycompile validate {bundle}` on a machine "
              "that can run these engines, or pass --allow-unvalidated")
        return 1
    findings = check_thresholds(report, minimum, maximum)
    if baseline is not None:
        findings += check_baseline(report, load_report(baseline), max_drop, max_slowdown)
    if findings:
        print(f"gate: FAIL ({len(findings)} finding{'s' if len(findings) > 1 else ''})")
        print(findings_table(findings))
        return 1
    print("gate: PASS" + (f" (baseline {baseline})" if baseline else ""))
    return 0


def _gate(args: argparse.Namespace) -> int:
    import json

    from cosycompile.validate.gate import allowance

    if args.list_metrics:
        from cosycompile.validate.registry import registry

        for name, reg in registry().items():
            m = reg.metric
            print(f"{name:<34} {m.kind:<8} {'higher' if m.higher else 'lower'} is better  {m.unit:<7} {m.description}")
        return 0
    if args.bundle is None:
        raise UserError("gate: give a bundle dir or report.json (or --list-metrics)")
    bundle: Path = args.bundle
    recipe_file = (bundle if bundle.is_dir() else bundle.parent) / "recipe.json"
    gate: dict = {}
    if recipe_file.is_file():
        gate = json.loads(recipe_file.read_text()).get("validation", {}).get("gate", {})
    # argparse's float takes "nan" and "inf": refused here, before any report is read, whether a flag or
    # the bundle's recipe.json gave the value.
    max_drop = allowance("--max-quality-drop", args.max_quality_drop) if args.max_quality_drop is not None \
        else allowance(f"{recipe_file}: max_quality_drop", gate.get("max_quality_drop", 0.05))
    max_slow = allowance("--max-slowdown", args.max_slowdown) if args.max_slowdown is not None \
        else allowance(f"{recipe_file}: max_slowdown", gate.get("max_slowdown", 0.25))
    minimum = {k: v for k, v in gate.get("min", {}).items() if v is not None}
    maximum = {k: v for k, v in gate.get("max", {}).items() if v is not None}
    return _apply_gate(bundle, args.baseline, minimum, maximum, max_drop, max_slow, args.allow_unvalidated)


def _report(args: argparse.Namespace) -> int:
    from cosycompile.validate.gate import load_report
    from cosycompile.validate.report import render_bundle

    load_report(args.bundle)
    out = render_bundle(args.bundle)
    print((args.bundle / "report.md").read_text())
    print(f"rendered: {', '.join(str(p) for p in out)}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from cosycompile.validate.gate import load_report, metric_values
    from cosycompile.validate.registry import registry

    a, b = metric_values(load_report(args.a)), metric_values(load_report(args.b))
    rows = [("metric", str(args.a.name), str(args.b.name), "better")]
    for name in registry():
        if name in a or name in b:
            va, vb = a.get(name), b.get(name)
            better = "-"
            if va is not None and vb is not None and va != vb:
                higher = registry()[name].metric.higher
                better = "A" if (va > vb) == higher else "B"
            rows.append((name, "-" if va is None else f"{va:.4g}", "-" if vb is None else f"{vb:.4g}", better))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


def _init_model(args: argparse.Namespace) -> int:
    from cosycompile.errors import ModelError
    from cosycompile.families import BUILTIN_PREFIX, builtin_family

    try:
        if not args.spec.startswith(BUILTIN_PREFIX):
            raise ModelError(f"'{args.spec}' is not a built-in model ({BUILTIN_PREFIX}<name>)")
        family = builtin_family(args.spec)
    except ModelError as exc:
        raise UserError(str(exc)) from None
    out: Path = args.out
    from cosycompile.commands._output import check_out_dir

    check_out_dir(out, "--out", need_parent=False)
    family.hook("init_model")(args.spec, out, seed=args.seed)
    print(f"wrote {args.spec} (seed {args.seed}) to {out}")
    return 0


def _cache(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from cosycompile.cache.local import Store

    if args.cache_command is None:
        parser.parse_args(["cache", "--help"])
        return 2
    store = Store(args.artifacts)
    if args.cache_command == "verify":
        count, bad = store.verify_all(full=args.full)
        print(f"{count} entries checked, {len(bad)} bad" + (f" (removed: {', '.join(b[:12] for b in bad)})" if bad else ""))
        return 1 if bad else 0
    if args.cache_command == "ls":
        from cosycompile.cache.local import ENTRY_FILE, CorruptEntry, read_entry

        for entry_file in sorted(store.objects.glob(f"*/*/{ENTRY_FILE}")):
            try:
                meta = read_entry(entry_file)
            except (OSError, CorruptEntry) as exc:
                print(f"{entry_file.parent.name[:12]}  BROKEN ({exc}; `cosycompile cache verify` removes it)")
                continue
            size = sum(s for s, _ in meta["files"].values())
            step, seconds = meta.get("step"), meta.get("seconds")
            step = step if isinstance(step, str) else "?"
            seconds = float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else 0.0
            print(f"{meta['key'][:12]}  {step[:40]:<16} {size / 1e6:9.1f} MB  {seconds:6.1f}s")
        return 0
    if args.cache_command == "gc":
        from cosycompile.cache.gc import collect, parse_age, parse_size

        if args.max_size is None and args.older_than is None:
            raise UserError("cache gc: give --max-size SIZE and/or --older-than AGE (nothing to decide by otherwise)")
        res = collect(store, parse_size(args.max_size) if args.max_size else None,
                      parse_age(args.older_than) if args.older_than else None, dry_run=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        print(f"{verb} {len(res.removed)} entries ({res.removed_bytes / 1e6:.1f} MB); kept {res.kept} "
              f"({res.kept_bytes / 1e6:.1f} MB, {res.pinned} needed by bundles under builds/)"
              + (f"; {res.stale_staging} stale staging dirs removed" if res.stale_staging else ""))
        return 0
    if args.cache_command in ("push", "pull"):
        from cosycompile.commands import cache_remote

        return cache_remote.run(args, store)
    return 2


if __name__ == "__main__":
    sys.exit(main())
