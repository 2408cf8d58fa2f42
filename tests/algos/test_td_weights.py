"""PER plumbing in the algorithms: importance weights scale the critic loss, per-item |TD| comes back for priorities."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from algo_helpers import batch, diffusion_actor, engine, gaussian_actor, tiny_critic

from dmrl.algos import TD3BC, DiffusionQL, DiffusionQLConfig, TD3BCConfig
from dmrl.algos.critic import td_regression
from dmrl.train.engine import Engine, EngineConfig


def test_td_regression_by_hand():
    q = torch.tensor([[1.0, 2.0, 0.0], [3.0, 2.0, -1.0]])  # (E=2, B=3)
    y = torch.tensor([0.0, 2.0, 1.0])
    loss, td = td_regression(q, y)
    # head 0: (1 + 0 + 1) / 3, head 1: (9 + 0 + 4) / 3
    assert loss.item() == pytest.approx(15 / 3)
    torch.testing.assert_close(td, torch.tensor([2.0, 0.0, 1.5]))  # mean over heads of |q - y|
    w = torch.tensor([0.0, 1.0, 2.0])
    loss_w, td_w = td_regression(q, y, w)
    assert loss_w.item() == pytest.approx((0 * 1 + 2 * 1) / 3 + (0 * 9 + 2 * 4) / 3)
    torch.testing.assert_close(td_w, td)  # the priority is the error, not the weighted error
    assert td_regression(q, y, torch.ones(3))[0].item() == pytest.approx(loss.item())


@pytest.mark.parametrize("kind", ["diffusion-ql", "td3-bc"])
def test_weights_reach_the_critic_loss_and_td_error_is_per_item(kind):
    actor = diffusion_actor(steps=2) if kind == "diffusion-ql" else gaussian_actor()
    critic = tiny_critic(actor)
    algo = DiffusionQL(actor, critic, DiffusionQLConfig(), engine()) if kind == "diffusion-ql" else None
    algo = algo or TD3BC(actor, critic, TD3BCConfig(policy_noise=0.0), engine())
    b = batch(6)

    def loss(weights=None):
        torch.manual_seed(0)  # the same target chunk a' (sampled or smoothed) in every call
        return algo.critic_loss(b if weights is None else {**b, "weights": weights})

    plain = loss()
    assert plain["td_error"].shape == (6,) and not plain["td_error"].requires_grad
    torch.testing.assert_close(loss(torch.ones(6))["loss"], plain["loss"])
    # linear in the per-item weights: the one-hot losses sum to the unweighted loss, and scale with their weight
    one_hot = [loss(torch.eye(6)[i])["loss"] for i in range(6)]
    torch.testing.assert_close(torch.stack(one_hot).sum(), plain["loss"])
    torch.testing.assert_close(loss(3 * torch.eye(6)[2])["loss"], 3 * one_hot[2])
    assert len({round(x.item(), 6) for x in one_hot}) > 1  # items differ, so a weight really picks one


def test_update_splits_the_batch_into_micro_batches_and_returns_td_error_for_all():
    actor = diffusion_actor(steps=2)
    eng = Engine(EngineConfig(device="cpu", precision="fp32", grad_clip=1.0, accumulate=2))
    algo = DiffusionQL(actor, tiny_critic(actor), DiffusionQLConfig(), eng)
    logs = algo.update(batch(8, seed=0))  # two micro-batches of 4
    assert isinstance(logs["td_error"], np.ndarray) and logs["td_error"].shape == (8,)
    assert np.all(np.isfinite(logs["td_error"])) and np.all(logs["td_error"] >= 0)
    assert logs["critic_loss"].ndim == 0 and np.isfinite(float(logs["critic_loss"]))
    with pytest.raises(ValueError, match="do not split into --engine.accumulate 2"):
        algo.update(batch(7, seed=1))
