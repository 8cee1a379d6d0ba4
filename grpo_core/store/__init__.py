"""What a run writes and reads back: the run directory (rundir), checkpoints
(checkpoint), saving and resuming run state (persist), loading and saving
models (models).
"""
