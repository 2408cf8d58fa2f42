"""QC and IDQL (dmrl.algos.qc, dmrl.algos.iql): the critic is read only on the proposal's samples or the data's
chunks, and on a two-mode bandit best-of-N picks the rewarded mode while the BC proposal keeps both (issue 27 §5)."""

from __future__ import annotations

import pytest
import torch
from algo_helpers import CHUNK, DA, OBS_DIMS, batch, diffusion_actor, engine
from test_q_guidance import MODE, _bandit_batch

from dmrl.algos import IDQL, QC, ChunkCritic, CriticConfig, IDQLConfig, QCConfig
from dmrl.algos.best_of_n import CriticRankedPolicy
from dmrl.algos.iql import expectile_loss
from dmrl.policies import DiffusionPolicyConfig, build_policy

SMALL = CriticConfig(n_critics=2, hidden=32, depth=2, encoder_per_member=True)


def _algo(kind: str, actor=None, **kw):
    actor = actor or diffusion_actor()
    cls, cfg = (QC, QCConfig) if kind == "qc" else (IDQL, IDQLConfig)
    config = cfg(critic=SMALL, **kw)
    return cls(actor, ChunkCritic(actor, config.critic), config, engine())


def test_per_member_encoders_are_independent_and_the_value_ensemble_reads_no_actions():
    algo = _algo("idql")
    enc = algo.critic.encoders
    assert len(enc) == 2 and enc[0].net[0].weight.data_ptr() != enc[1].net[0].weight.data_ptr()
    b = batch(5)
    f = algo.critic.features(b["obs"])  # (E, B, D): members differ
    assert f.shape[:2] == (2, 5) and not torch.allclose(f[0], f[1])
    assert algo.value(b["obs"]).shape == (1, 5)
    with pytest.raises(ValueError, match="with_actions"):
        algo.value(b["obs"], torch.zeros(5, CHUNK.n_action_steps, DA))


def test_qc_backup_reads_q_only_at_the_proposals_samples():
    algo = _algo("qc", backup_samples=3)
    sampled, scored = [], []
    sample, target = algo.policy.sample_chunk, algo.critic_target.forward

    def record_sample(*a, **k):
        out = sample(*a, **k)
        sampled.append(algo.critic.executed(out).clone())
        return out

    def record_q(obs, actions=None):
        scored.append(actions.clone())
        return target(obs, actions)

    algo.policy.sample_chunk, algo.critic_target.forward = record_sample, record_q
    b = batch(4)
    q = algo.backup_q(b["next_obs"])
    assert q.shape == (4,) and len(sampled) == 1 and len(scored) == 1
    assert scored[0].shape == (4 * 3, CHUNK.n_action_steps, DA)
    assert torch.equal(scored[0], sampled[0])  # every chunk Q reads is one the proposal produced
    # The target is the max over the samples of the ensemble minimum.
    rep = {"state": b["next_obs"]["state"].repeat_interleave(3, 0)}
    want = target(rep, sampled[0]).min(0).values.view(4, 3).max(1).values
    torch.testing.assert_close(q, want)


def test_idql_trains_on_data_chunks_only():
    algo = _algo("idql")
    algo.policy.sample_chunk = algo.actor.sample_chunk = None  # any sampling during training would fail
    logs = algo.update(batch(8))
    assert {"critic_loss", "critic_v_loss", "actor_loss"} <= set(logs) and logs["td_error"].shape == (8,)


def test_expectile_loss_by_hand():
    diff = torch.tensor([2.0, -1.0])
    assert expectile_loss(diff, 0.7).item() == pytest.approx((0.7 * 4 + 0.3 * 1) / 2)
    assert expectile_loss(diff, 0.5).item() == pytest.approx(0.5 * (4 + 1) / 2)


@pytest.mark.parametrize("kind", ["qc", "idql"])
def test_best_of_n_picks_the_rewarded_mode_while_the_bc_proposal_keeps_both(kind):
    torch.manual_seed(1)
    cfg = DiffusionPolicyConfig(denoiser_kwargs={"hidden_dim": 64, "n_blocks": 1}, num_train_steps=20,
                                num_inference_steps=4, prediction_type="sample")  # fmt: skip
    actor = build_policy("diffusion", CHUNK, cfg, OBS_DIMS, DA)
    algo = _algo(kind, actor, actor_lr=3e-3, critic_lr=3e-3, actor_tau=1.0, n_action_samples=16)
    g = torch.Generator().manual_seed(2)
    for _ in range(300):
        algo.update(_bandit_batch(64, g))
    obs = {"state": torch.zeros(256, CHUNK.n_obs_steps, 5)}
    with torch.no_grad():
        proposal = algo.critic.executed(algo.policy.predict_chunk(obs)).mean(dim=(1, 2))
        ranked = algo.evaluation_policy()
        assert isinstance(ranked, CriticRankedPolicy)
        chosen = algo.critic.executed(ranked.predict_chunk(obs)).mean(dim=(1, 2))
    bc_plus, plus = (proposal > 0).float().mean().item(), (chosen > 0).float().mean().item()
    assert 0.1 < bc_plus < 0.9, f"the BC proposal should keep both modes; + share {bc_plus:.2f}"
    assert plus > 0.95, f"{kind}: best-of-16 should pick the rewarded mode; + share {plus:.2f} (proposal {bc_plus:.2f})"
    assert (chosen.abs() < MODE / 2).float().mean().item() < 0.05  # the choice stays on a mode


def test_candidate_noise_reaches_the_acting_policy_and_bad_values_are_refused():
    ranked = _algo("qc", candidate_noise=0.2, n_action_samples=4).evaluation_policy()
    assert isinstance(ranked, CriticRankedPolicy) and ranked.noise == 0.2
    with pytest.raises(ValueError, match="candidate-noise"):
        QCConfig(candidate_noise=-0.1)
    with pytest.raises(ValueError, match="candidate-noise"):
        QCConfig(candidate_noise=0.2, n_action_samples=1)
