"""Energy optimisers: the cost model, the power-limit profiler and the batch-size bandit."""
