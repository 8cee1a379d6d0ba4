"""Multi-turn environments: the episode loop between generator and environment
plugin (episodes), and how observations become context tokens (observations).
"""
