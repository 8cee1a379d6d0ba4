"""Rewards inside the loop: calling a reward plugin with its checks and failure
policies (call), and running it in a killable worker process (isolation).
"""
