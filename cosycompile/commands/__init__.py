"""The ``cosycompile`` commands, one module each (``cli.py`` discovers them): ``ORDER``, ``add_parser(sub)``
and ``run(args) -> int``, raising :class:`cosycompile.errors.UserError` for bad input (exit 2, one line on
stderr). Modules whose name starts with ``_`` hold what several commands share. Nothing here imports
torch at import time: ``--help`` and a cached build stay light.
"""
