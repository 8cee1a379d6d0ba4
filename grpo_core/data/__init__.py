"""Prompts in: where rows come from (sources) and the reproducible prompt order
and batches a step draws (prompts).
"""
