"""``python -m tuner``: see :mod:`tuner.cli`."""
import sys

from .cli import main

sys.exit(main())
