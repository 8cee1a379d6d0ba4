"""``python -m grpo_core.cli``: the ``grpo`` command (what torchrun launches)."""

import sys

from grpo_core.cli.main import main

sys.exit(main())
