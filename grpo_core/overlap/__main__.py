"""``python -m grpo_core.overlap FD``: the generator process (grpo_core.overlap.process)."""

import sys

from grpo_core.overlap.process import main

sys.exit(main(sys.argv[1:]))
