"""`python -m opcompiler` is the `opcompiler` command."""
import sys

from .cli import main

sys.exit(main())
