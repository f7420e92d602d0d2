"""Run the ssdgen CLI from a frozen snapshot of the code (argv[1]), not from the editable checkout, so a long
training run never imports code edited while it runs."""
import sys

import __editable___ssdgen_0_1_0_finder as finder

root = sys.argv.pop(1)
for k, v in list(finder.MAPPING.items()):
    finder.MAPPING[k] = v.replace("/work/main", root)
for k, v in list(finder.NAMESPACES.items()):
    finder.NAMESPACES[k] = [p.replace("/work/main", root) for p in v]
from ssdgen.cli import main  # noqa: E402

sys.argv[0] = "ssdgen"
main()
