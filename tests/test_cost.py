import pytest

from zeus_callbacks.optimizers.cost import ZeusCost


def test_cost_weights_energy_and_time_by_eta():
    energy_J, time_s, max_W = 1234.0, 5.5, 250.0
    for eta in (0.0, 0.3, 1.0):
        expected = eta * energy_J + (1 - eta) * max_W * time_s
        assert ZeusCost(eta, max_W)(energy_J, time_s) == pytest.approx(expected)


def test_multi_gpu_cost_sums_energy_and_takes_the_slowest_rank():
    cost = ZeusCost.for_gpus(0.5, max_limit_W=300.0, num_gpus=2)
    assert cost.max_power_W == 600.0
    assert cost.of_ranks([100.0, 150.0], [2.0, 3.0]) == pytest.approx(0.5 * 250.0 + 0.5 * 600.0 * 3.0)


@pytest.mark.parametrize("eta, max_W", [(-0.1, 100.0), (1.1, 100.0), (0.5, 0.0)])
def test_cost_rejects_bad_knobs(eta, max_W):
    with pytest.raises(ValueError):
        ZeusCost(eta, max_W)
