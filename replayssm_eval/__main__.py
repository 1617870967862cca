"""`python -m replayssm_eval` is the `replayssm-eval` command."""

import sys

from replayssm_eval.cli import main

sys.exit(main())
