"""Chunk critic: the Ta-step TD target by hand, Polyak averaging, clipped double Q, shapes and frozen weights."""

from __future__ import annotations

import pytest
import torch
from algo_helpers import batch, diffusion_actor, engine, gaussian_actor, tiny_critic

from dmrl.algos import DiffusionQL, DiffusionQLConfig, chunk_td_target, polyak_update
from dmrl.algos.critic import CriticConfig, frozen, frozen_copy

G = 0.9


def _target(reward, done, valid, next_valid, next_q):
    t = lambda x, dt=torch.float32: torch.tensor([x], dtype=dt)  # noqa: E731
    b = torch.bool
    return chunk_td_target(t(reward), t(done, b), t(valid, b), t(next_valid, b)[0:1], t(next_q)[0:1], G).item()


def test_td_target_by_hand():
    # Ta = 3, all steps observed, no termination: discounted sum + gamma^3 * next Q.
    assert _target([1.0, 2.0, 3.0], [0, 0, 0], [1, 1, 1], 1, 10.0) == pytest.approx(1 + G * 2 + G**2 * 3 + G**3 * 10)
    # Done in the middle: rewards up to and including the terminal step, nothing after it, no bootstrap. The
    # reward after done (5.0) is never counted, even if the data held one there.
    assert _target([1.0, 2.0, 5.0], [0, 1, 0], [1, 1, 1], 1, 10.0) == pytest.approx(1 + G * 2)
    # Truncation exactly at the chunk's end: no done, the final observation is next_obs -> bootstrap.
    assert _target([1.0, 2.0, 3.0], [0, 0, 0], [1, 1, 1], 1, -4.0) == pytest.approx(1 + G * 2 + G**2 * 3 - G**3 * 4)
    # Padding past the end of a truncated episode: invalid steps count nothing, next_valid False: no bootstrap.
    assert _target([1.0, 7.0, 7.0], [0, 0, 0], [1, 0, 0], 0, 10.0) == pytest.approx(1.0)
    # Terminal step then padding (the dataset's last window of a terminated episode).
    assert _target([1.0, 2.0, 0.0], [0, 1, 0], [1, 1, 0], 0, 10.0) == pytest.approx(1 + G * 2)


def test_td_target_batched_shapes():
    b, ta = 5, 4
    y = chunk_td_target(
        torch.ones(b, ta), torch.zeros(b, ta, dtype=torch.bool), torch.ones(b, ta, dtype=torch.bool),
        torch.ones(b, dtype=torch.bool), torch.zeros(b), 0.5,
    )  # fmt: skip
    assert y.shape == (b,) and torch.allclose(y, torch.full((b,), 1 + 0.5 + 0.25 + 0.125))


def test_polyak_update_moves_trainable_weights_and_copies_buffers():
    source = tiny_critic(diffusion_actor())
    target = frozen_copy(source)
    assert all(not p.requires_grad for p in target.parameters())
    source.encoder.net[0].weight.requires_grad_(False)  # a frozen backbone weight: never averaged
    before = {n: p.detach().clone() for n, p in target.named_parameters()}
    with torch.no_grad():
        for p in source.parameters():
            p.add_(1.0)
        source.normalizer.state_scale.fill_(3.0)
    polyak_update(target, source, 0.25)
    for (name, t), s in zip(target.named_parameters(), source.parameters(), strict=True):
        expected = before[name] if name == "encoder.net.0.weight" else 0.75 * before[name] + 0.25 * s.detach()
        torch.testing.assert_close(t, expected)
    assert torch.equal(target.normalizer.state_scale, source.normalizer.state_scale)


def test_critic_shapes_own_encoder_and_executed_slice():
    actor = diffusion_actor()
    critic = tiny_critic(actor, n_critics=3)
    b = batch(6)
    executed = critic.executed_from_data(b["action"])
    assert executed.shape == (6, 4, 3)  # Ta executed actions: action index To-1 = 1 .. 4
    torch.testing.assert_close(executed, actor.normalizer.normalize("actions", b["action"])[:, 1:5])
    q = critic(b["obs"], executed)
    assert q.shape == (3, 6) and not torch.allclose(q[0], q[1])  # independent heads
    actor_ptrs = {p.data_ptr() for p in actor.parameters()}
    assert not actor_ptrs & {p.data_ptr() for p in critic.parameters()}  # its own encoder, no shared weights
    assert type(critic.encoder) is type(actor.encoder)
    with pytest.raises(ValueError, match="n_critics"):
        CriticConfig(n_critics=0)


def test_clipped_double_q_uses_the_ensemble_minimum():
    actor = diffusion_actor()
    algo = DiffusionQL(actor, tiny_critic(actor), DiffusionQLConfig(), engine())
    b = batch(2)
    b["reward"] = torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 2.0]])

    class FixedQ(torch.nn.Module):
        def forward(self, obs, actions):
            return torch.tensor([[1.0, 5.0], [3.0, 2.0]])  # (E, B): min over E = [1, 2]

    algo.critic_target = FixedQ()
    g4 = algo.critic.config.gamma**4
    expected = torch.tensor([1.0 + g4 * 1.0, 2.0 * algo.critic.config.gamma**3 + g4 * 2.0])
    assert algo.critic_loss(b)["target"].item() == pytest.approx(expected.mean().item(), rel=1e-6)


def test_frozen_blocks_critic_gradients_and_restores_only_trainable():
    actor = gaussian_actor()
    critic = tiny_critic(actor)
    critic.encoder.net[0].bias.requires_grad_(False)
    b = batch(4)
    with frozen(critic):
        q = critic(b["obs"], critic.executed(actor.sample_chunk(actor.encode(b["obs"]), grad_steps=1)))
        q.sum().backward()
    assert all(p.grad is None for p in critic.parameters())
    assert any(p.grad is not None for p in actor.parameters())
    assert not critic.encoder.net[0].bias.requires_grad
    assert sum(not p.requires_grad for p in critic.parameters()) == 1
