"""``python -m cosycompile``."""

import sys

from .cli import main

sys.exit(main())
