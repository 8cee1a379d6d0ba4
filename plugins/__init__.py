"""grpo-core's built-in plugins (installed as ``grpo_core_plugins``)."""
