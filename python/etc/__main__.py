"""`python -m etc ...`: the `etc` command without the console script."""

import sys

from etc.cli import main

sys.exit(main())
