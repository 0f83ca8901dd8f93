"""``python -m kernels.psa_search``: the search's command line (``cli``)."""
import sys

from .cli import main

sys.exit(main())
