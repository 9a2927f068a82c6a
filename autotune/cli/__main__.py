"""`python -m autotune.cli ...`, as the `autotune` script (local workers start themselves this way)."""
import sys

from autotune.cli.main import main

sys.exit(main())
