"""The step's pure tensor math: completion log-probs (logprobs), the loss around
the policy objective (losses), and the [P, G] group grid (groups).
"""
