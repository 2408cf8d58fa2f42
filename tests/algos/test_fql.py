"""FQL (dmrl.algos.fql): the distillation loss vanishes when the student is the teacher's noise-to-chunk map, the
student acts in one call, and on a two-mode bandit the student picks the rewarded mode (issue 27, section 5)."""

from __future__ import annotations

import pytest
import torch
from algo_helpers import CHUNK, DA, OBS_DIMS, batch, engine
from test_q_guidance import MODE, _bandit_batch

from dmrl.algos import FQL, ChunkCritic, CriticConfig, FQLConfig
from dmrl.policies import DiffusionPolicyConfig, build_policy

SMALL = CriticConfig(n_critics=2, hidden=32, depth=2, encoder_per_member=True)


def _teacher(hidden: int = 32, ddim_eta: float = 0.0):
    cfg = DiffusionPolicyConfig(denoiser_kwargs={"hidden_dim": hidden, "n_blocks": 1}, num_train_steps=20,
                                num_inference_steps=4, prediction_type="sample", ddim_eta=ddim_eta)  # fmt: skip
    return build_policy("diffusion", CHUNK, cfg, OBS_DIMS, DA)


def _fql(teacher=None, **kw) -> FQL:
    teacher = teacher or _teacher()
    config = FQLConfig(critic=SMALL, student_hidden=32, student_depth=2, **kw)
    return FQL(teacher, ChunkCritic(teacher, config.critic), config, engine())


def test_distillation_is_zero_when_the_student_is_the_teachers_map():
    algo = _fql()
    obs = batch(6)["obs"]
    noise = torch.randn(6, CHUNK.horizon, DA)
    _, distill = algo.distillation(obs, noise)
    assert distill.item() > 0  # a fresh student is not the teacher
    teacher = algo.actor
    algo.student.condition = teacher.condition  # the student becomes the teacher's deterministic DDIM map
    algo.student.sample_chunk = lambda cond, mask=None, init_noise=None: teacher.sample_chunk(
        cond, mask, init_noise=init_noise
    )
    chunk, distill = algo.distillation(obs, noise)
    assert distill.item() == 0.0 and chunk.shape == (6, CHUNK.horizon, DA)


def test_the_student_acts_in_one_call_and_a_stochastic_teacher_is_refused():
    algo = _fql()
    logs = algo.update(batch(8))
    assert {"critic_loss", "actor_distill", "actor_q_loss", "actor_bc_loss"} <= set(logs)
    policy = algo.evaluation_policy()
    assert policy is algo.student
    a = policy.act({"state": torch.zeros(3, 5)})
    assert a.shape == (3, DA) and abs(a).max() <= 1.0
    with pytest.raises(ValueError, match="ddim-eta 0"):
        _fql(_teacher(ddim_eta=1.0))


def test_the_student_picks_the_rewarded_mode():
    # Sending the teacher's "-" noises to the "+" mode costs alpha * (2 MODE)^2 = 1.44 alpha of distillation against
    # a normalised Q gain of about 1, so the flip needs a small alpha (at 1 the student stops between the modes).
    torch.manual_seed(1)
    algo = _fql(_teacher(hidden=64), alpha=0.1, actor_lr=3e-3, critic_lr=3e-3)
    g = torch.Generator().manual_seed(2)
    for _ in range(300):
        algo.update(_bandit_batch(64, g))
    obs = {"state": torch.zeros(256, CHUNK.n_obs_steps, 5)}
    with torch.no_grad():
        teacher = algo.critic.executed(algo.actor.predict_chunk(obs)).mean(dim=(1, 2))
        student = algo.critic.executed(algo.student.predict_chunk(obs)).mean(dim=(1, 2))
    bc_plus, plus = (teacher > 0).float().mean().item(), (student > 0).float().mean().item()
    assert 0.1 < bc_plus < 0.9, f"the BC teacher should keep both modes; + share {bc_plus:.2f}"
    assert plus > 0.9, f"the student should take the rewarded mode; + share {plus:.2f} (teacher {bc_plus:.2f})"
    assert (student.abs() < MODE / 2).float().mean().item() < 0.08
