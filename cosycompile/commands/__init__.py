"""Bodies of CLI commands that work on a finished bundle (``pack``, ``unpack``, ``synthesize``).

``cli.py`` holds only their parser entries and dispatch lines; each module here has one
``run(args) -> int`` and raises :class:`cosycompile.errors.UserError` for bad input (exit 2,
one line on stderr). Nothing here imports torch.
"""
