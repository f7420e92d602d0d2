"""Run the ssdgen CLI from another code tree (argv[1], e.g. a `git archive` of a commit), not from the editable
checkout: the editable install's module mapping is pointed at that tree for this process only."""
import os
import sys

import __editable___ssdgen_0_1_0_finder as finder

root = sys.argv.pop(1)
checkout = os.path.dirname(finder.MAPPING["ssdgen"])  # where the editable install points: this checkout
for k, v in list(finder.MAPPING.items()):
    finder.MAPPING[k] = v.replace(checkout, root, 1)
for k, v in list(finder.NAMESPACES.items()):
    finder.NAMESPACES[k] = [p.replace(checkout, root, 1) for p in v]
from ssdgen.cli import main  # noqa: E402

sys.argv[0] = "ssdgen"
main()
