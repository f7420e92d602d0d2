"""`python -m ssdgen.cli ...`, the same as the `ssdgen` script."""

import sys

from ssdgen.cli.app import main

sys.exit(main())
