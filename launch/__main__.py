"""`python -m popxl_launch ...` is `popxl-run ...`."""
import sys

from .cli import main

sys.exit(main())
