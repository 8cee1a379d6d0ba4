"""Adapters that let other RL libraries use grpo-core plugins."""
