"""Errors the CLI turns into a one-line message and exit code 2 (the user's fault)."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: a config, a plugin name, a file. Printed without traceback."""


class ConfigError(UserError):
    """One or more config problems; ``problems`` holds one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class PluginError(UserError):
    """A plugin could not be loaded, found or built."""
