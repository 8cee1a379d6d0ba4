"""``python -m grpo_core.workers``: a worker or the fork server (never the caller's main)."""

import sys

from grpo_core.workers.child import main

sys.exit(main())
