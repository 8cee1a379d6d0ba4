import torch
from grpo_reward_pack import MedianBaseline, NoRepetition


def test_no_repetition():
    r = NoRepetition(n=2, min_words=2)
    assert r(["p", "p"], ["a b c d", "a b a b a b"]) == [1.0, 2 / 5]


def test_median_baseline_ignores_an_outlier():
    adv = MedianBaseline().advantages(torch.tensor([[0.0, 1.0, 1.0, 100.0]]))
    assert adv[0, 1] == 0 and adv[0, 0] < 0 < adv[0, 3]
