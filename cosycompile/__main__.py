"""``python -m cosycompile``."""

import sys

from cosycompile.cli import main

sys.exit(main())
