"""``cosycompile speakers add|ls|rm BUNDLE``: a bundle's speaker cache (:mod:`cosycompile.runtime.speakers`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cosycompile.errors import UserError

ORDER = 115
EXAMPLES = (
    ('cosycompile speakers add DIR --name alice --prompt-wav a.wav --prompt-text "..."',
     "cache a voice's prompt features in the bundle"),
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """This command's entry in the ``cosycompile`` parser."""
    p = sub.add_parser("speakers", help="named voices cached in a bundle (synthesize --speaker NAME)",
                       description="A speaker is a zero-shot prompt whose features (speech tokens, mel, speaker "
                                   "embedding) are computed once with the bundle's own front end and stored in the "
                                   "bundle (speakers/NAME.npz, listed in its manifest), so a request naming it "
                                   "skips the front end's prompt models.")
    p.set_defaults(speakers_parser=p)
    ssub = p.add_subparsers(dest="speakers_command", metavar="ACTION")
    add = ssub.add_parser("add", help="compute a prompt's features and store them under a name")
    add.add_argument("bundle", type=Path, help="bundle dir")
    add.add_argument("--name", required=True, help="the speaker's name (letters, digits, '.', '_', '-')")
    add.add_argument("--prompt-wav", type=Path, required=True, metavar="WAV", help="the voice's prompt audio")
    add.add_argument("--prompt-text", required=True, metavar="TEXT", help="what the prompt audio says")
    add.add_argument("--replace", action="store_true", help="overwrite a speaker of that name")
    ls = ssub.add_parser("ls", help="list a bundle's speakers")
    ls.add_argument("bundle", type=Path, help="bundle dir")
    rm = ssub.add_parser("rm", help="remove a speaker from a bundle")
    rm.add_argument("bundle", type=Path, help="bundle dir")
    rm.add_argument("--name", required=True, help="the speaker to remove")
    return p


def run(args: argparse.Namespace) -> int:
    """The ``speakers`` command."""
    from cosycompile.runtime.bundle import bundle_parts
    from cosycompile.runtime.speakers import check_name, remove_speaker, speaker_names

    if args.speakers_command is None:
        args.speakers_parser.print_help()
        return 2
    manifest, _ = bundle_parts(args.bundle)
    if args.speakers_command == "ls":
        for name in speaker_names(manifest):
            print(name)
        return 0
    if args.speakers_command == "rm":
        remove_speaker(args.bundle, args.name)
        print(f"removed speaker {args.name} from {args.bundle}")
        return 0
    check_name(args.name)
    from cosycompile.runtime.bundle import FRONTEND_DIR, verify_frontend
    from cosycompile.runtime.dataset import check_prompt_text, read_wav
    from cosycompile.runtime.frontend import Frontend
    from cosycompile.runtime.speakers import Speaker, add_speaker

    check_prompt_text(args.prompt_text, "--prompt-text")
    wav, sr = read_wav(args.prompt_wav)
    verify_frontend(args.bundle, manifest)
    # One thread, as synthesize's front end runs: the cached features are what a request would compute.
    tokens, mel, embedding = Frontend(args.bundle / FRONTEND_DIR, threads=1).prompt_features(wav, sr)
    if not len(tokens):
        raise UserError(f"{args.prompt_wav}: too short to give a speech token")
    rel = add_speaker(args.bundle, Speaker(args.name, args.prompt_text, tokens, mel, embedding), args.replace)
    print(f"added speaker {args.name}: {args.bundle / rel} ({len(tokens)} prompt tokens)")
    return 0
