"""The ``grpo`` command and its tools (compare, plots, memory planner, demo, GPU check,
plugin tools): the floor above the trainer. Nothing in the core imports from here."""
