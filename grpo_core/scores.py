"""What a reward returns: one float per completion, optionally with named dimensions."""

from __future__ import annotations


class Scores(list):
    """A list of floats (one per completion; None where there is no reward) that may also
    carry:

    ``dimensions``: ``{name: [float per completion]}``, logged as ``reward/<name>``;
    ``extras``: ``{name: [value per completion]}``, e.g. the extracted answer, for samples.
    """

    def __init__(self, values, dimensions: dict | None = None, extras: dict | None = None):
        super().__init__(None if v is None else float(v) for v in values)  # None: no reward
        self.dimensions = dict(dimensions or {})
        self.extras = dict(extras or {})
