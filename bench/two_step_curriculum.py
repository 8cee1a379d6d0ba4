"""Two-step word problems by a curriculum on SmolLM2-135M-Instruct (issue #49 item 2; the
figures in docs/recipes.md, the ninth round): ``grpo demo --task two-step`` at one thread
(grpo_core/cli/demo_two_step.py), then each stage's final model judged greedily on the
demo's 100 held-out problems under each of the three system prompts, by kind
(``OUT/report.json``).

    python bench/two_step_curriculum.py OUT [--seed 0] [--stage3-steps 20]

``--seed`` is the demo's ``train.seed``, which every stage keeps. Micro-batches of two groups
keep a stage's memory near 6 GB, so it can run beside another job; about 30 minutes a
30-step stage on one core.
"""

from __future__ import annotations

import argparse
import json
import os

from grpo_core.cli import demo_two_step

ONE_THREAD = ["runtime.threads=1", "train.micro_batch_groups=2"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stage3-steps", type=int, default=20)
    args = p.parse_args()
    stage_steps = (demo_two_step.STAGES[0][-1], args.stage3_steps)
    demo_two_step.run(
        args.out, None, [*ONE_THREAD, f"train.seed={args.seed}"], stage_steps=stage_steps
    )
    stages = [os.path.join(args.out, f"stage{i}") for i in (1, 2, 3)]
    report = {
        stage: {
            name: demo_two_step.judge(stage, os.path.join(stage, "run", "final"), text)[0]
            for name, text in demo_two_step.PROMPTS.items()
        }
        for stage in stages
    }
    with open(os.path.join(args.out, "report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
