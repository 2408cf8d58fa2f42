"""The distilled student (policies/student.py, algos/distill.py, dmrl distill): its start from the teacher, its
sampling, that distillation keeps two modes apart, and the command."""

from __future__ import annotations

import json

import pytest
import torch
from torch import Tensor, nn

from dmrl.cli import main
from dmrl.data import Normalizer
from dmrl.policies import ChunkConfig, DiffusionPolicy, DiffusionPolicyConfig, StudentPolicy, StudentPolicyConfig
from dmrl.policies.checkpoint import load_policy

OBS = {"state": 3}


def _pair(steps: int, student_kwargs: dict | None = None) -> tuple[DiffusionPolicy, StudentPolicy]:
    chunk = ChunkConfig(obs_keys=("state",), n_obs_steps=2, horizon=8, n_action_steps=4)
    tcfg = DiffusionPolicyConfig(
        denoiser_kwargs={"hidden_dim": 32}, num_train_steps=20, num_inference_steps=steps, prediction_type="sample"
    )
    torch.manual_seed(0)
    teacher = DiffusionPolicy(chunk, tcfg, OBS, 2)
    for p in teacher.denoiser.parameters():  # the output layer starts at zero: give it something to copy
        nn.init.normal_(p, std=0.2)
    scfg = StudentPolicyConfig(
        denoiser_kwargs=student_kwargs or {"hidden_dim": 32}, num_train_steps=20, teacher_steps=steps
    )
    return teacher.eval(), StudentPolicy(chunk, scfg, OBS, 2).eval()


def test_student_copied_from_a_one_step_teacher_is_that_teacher():
    teacher, student = _pair(steps=1)
    assert student.copy_teacher(teacher) == []
    obs = {"state": torch.randn(5, 2, 3)}
    z = torch.randn(5, 8, 2)
    with torch.no_grad():
        want = teacher.sample_chunk(*teacher.condition(obs), init_noise=z)
        got = student.sample_chunk(*student.condition(obs), init_noise=z)
    torch.testing.assert_close(got, want)
    student.attach_teacher(teacher)
    batch = {"obs": obs, "action": torch.zeros(5, 8, 2)}
    assert student.loss(batch)["loss"].item() == pytest.approx(0.0, abs=1e-10)


def test_two_step_sampling_renoises_at_the_grid_middle():
    _, student = _pair(steps=10)
    student.config.steps = 2
    assert student.starts == (0, 5)
    cond = torch.randn(4, student.encoder.out_dim)
    z, eps = torch.randn(4, 8, 2), torch.randn(1, 4, 8, 2)
    with torch.no_grad():
        got = student.sample_chunk(cond, init_noise=z, step_noise=eps)
        first = student.denoiser(z, student.grid[0].expand(4), cond).clamp(-1, 1)
        x = student.grid_sqrt_ab[5] * first + student.grid_sqrt_1m_ab[5] * eps[0]
        want = student.denoiser(x, student.grid[5].expand(4), cond).clamp(-1, 1)
    torch.testing.assert_close(got, want)


def test_teacher_with_another_grid_is_refused():
    teacher, _ = _pair(steps=10)
    _, student = _pair(steps=5)
    with pytest.raises(ValueError, match="dmrl distill"):
        student.attach_teacher(teacher)
    with pytest.raises(ValueError, match="no teacher attached"):
        student.loss({"obs": {"state": torch.randn(2, 2, 3)}, "action": torch.zeros(2, 8, 2)})


class TwoChunkX0(nn.Module):
    """E[x0 | x_t] when the chunk is all +0.8 or all -0.8 with probability 1/2 each (two routes): a teacher whose
    DDIM chain sends each noise to one route, by the sign of its sum."""

    def __init__(self, schedule) -> None:
        super().__init__()
        self.s0, self.s1 = schedule.sqrt_alphas_cumprod, schedule.sqrt_one_minus_alphas_cumprod

    def forward(self, x: Tensor, t: Tensor, cond: Tensor, cond_mask=None) -> Tensor:
        s0, s1 = self.s0[t][:, None, None], self.s1[t][:, None, None]
        logit = 0.8 * s0 * x.sum(dim=(1, 2), keepdim=True) / s1**2
        return 0.8 * torch.tanh(logit).expand_as(x)


def test_distillation_keeps_both_modes_where_regression_to_the_mean_would_not():
    teacher, student = _pair(steps=5, student_kwargs={"hidden_dim": 64})
    teacher.denoiser = TwoChunkX0(teacher.schedule)
    student.attach_teacher(teacher)
    student.train()
    opt = torch.optim.Adam(student.denoiser.parameters(), lr=1e-3)
    torch.manual_seed(1)
    for _ in range(150):
        obs = {"state": torch.randn(64, 2, 3)}
        loss = student.loss({"obs": obs, "action": torch.zeros(64, 8, 2)})["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        obs = {"state": torch.randn(400, 2, 3)}
        z = torch.randn(400, 8, 2)
        chunk = student.sample_chunk(*student.condition(obs), init_noise=z).mean(dim=(1, 2))  # (B,) the route
        target = teacher.sample_chunk(*teacher.condition(obs), init_noise=z).mean(dim=(1, 2))
    # The teacher sends each noise to a route; the one-step student lands on the same route for the same noise,
    # near the route itself (the mean of the two, 0, is where a regression of the chunk would land). Noises near the
    # boundary (sum close to 0) are where a short training still errs.
    side = z.sum(dim=(1, 2)).sign()
    assert torch.equal(target.sign(), side) and (target.abs() > 0.7).all()
    assert (chunk.sign() == side).float().mean() > 0.85
    assert (chunk.abs() > 0.6).float().mean() > 0.7, chunk.abs().quantile(0.1)
    assert 0.35 < (chunk > 0).float().mean() < 0.65


TINY = ["--batch-size", "8", "--chunk.horizon", "8", "--chunk.n-action-steps", "4", "--chunk.encoder.width", "32"]
DIFFUSION = ["--policy.num-train-steps", "20", "--policy.num-inference-steps", "4"]
DIFFUSION += ["--policy.denoiser-kwargs", "hidden_dim", "32"]


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    data = root / "d.zarr"
    assert main(["collect", "--out", str(data), "--episodes", "3", "--workers", "0", "--obs-modes", "state"]) == 0
    run = root / "teacher"
    assert main(["train", "--dataset", str(data), "--out", str(run), *TINY, *DIFFUSION, "--steps", "3"]) == 0
    return run / "checkpoint"


def test_distill_command_trains_a_student_that_loads_and_evaluates(tmp_path, teacher_run, capsys):
    out = tmp_path / "student"
    args = ["distill", "--teacher", str(teacher_run), "--out", str(out), "--steps", "4", "--batch-size", "8"]
    assert main([*args, "--student-steps", "2", "--eval-episodes", "1", "--eval-envs", "1"]) == 0
    student, meta = load_policy(out / "checkpoint")
    teacher, _ = load_policy(teacher_run)
    assert student.name == "student" and meta["algo"] == "distill" and student.config.steps == 2
    assert student.config.teacher_steps == 4 and torch.equal(student.grid, teacher.sampler.timesteps)
    # Frozen encoder (the default): the student's is still the teacher's.
    for a, b in zip(student.encoder.state_dict().values(), teacher.encoder.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["step"] == 4 and "distill_first" in lines[-1]
    assert json.loads((out / "summary.json").read_text())["eval"]["episodes"] == 1
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(out / "checkpoint"), "--episodes", "1", "--envs", "1"]) == 0


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--student-steps", "3"], "student steps"),
        (["--hidden-dim", "0"], "hidden_dim"),
        (["--dagger-rounds", "-1"], "--dagger-rounds"),
        (["--noise-samples", "0"], "--algo.noise-samples"),
    ],
)
def test_distill_bad_flags_are_one_line(tmp_path, teacher_run, capsys, extra, needle):
    out = tmp_path / "s"
    assert main(["distill", "--teacher", str(teacher_run), "--out", str(out), "--steps", "1", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not out.exists()


def test_distill_of_a_missing_teacher_is_one_line(tmp_path, capsys):
    assert main(["distill", "--teacher", str(tmp_path / "nope"), "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--teacher" in err[0], err


def test_distill_normalizer_comes_from_the_teacher(teacher_run):
    teacher, _ = load_policy(teacher_run)
    chunk = teacher.chunk
    scfg = StudentPolicyConfig(denoiser_kwargs={"hidden_dim": 32}, num_train_steps=20, teacher_steps=4)
    dims = {"state": torch.randn(50, int(teacher.obs_dims["state"])), "actions": torch.randn(50, teacher.action_dim)}
    other = Normalizer.fit({k: 5.0 * v.numpy() for k, v in dims.items()})
    student = StudentPolicy(chunk, scfg, dict(teacher.obs_dims), teacher.action_dim, other)
    student.copy_teacher(teacher)
    torch.testing.assert_close(student.normalizer.actions_scale, teacher.normalizer.actions_scale)


def test_visited_windows_are_labelled_by_the_teachers_chain_from_the_same_noise():
    from dmrl.algos.distill import mix_windows

    teacher, student = _pair(steps=4)
    student.copy_teacher(teacher)
    student.attach_teacher(teacher)
    batch = {"obs": {"state": torch.zeros(6, 2, 3)}, "action": torch.zeros(6, 8, 2)}
    windows = {"state": 5.0 + torch.randn(10, 2, 3).numpy()}
    mixed = mix_windows(batch, windows, 0.5, torch.Generator().manual_seed(0))
    state = mixed["obs"]["state"]
    # The first half are visited windows (rows of `windows`), the rest the store's; actions untouched.
    for row in state[:3]:
        assert any(torch.allclose(row, torch.as_tensor(w)) for w in windows["state"])
    assert torch.equal(state[3:], torch.zeros(3, 2, 3)) and mixed["action"] is batch["action"]
    seen = {}
    chain = student.teacher_chain

    def spy(obs, z, enc=None):
        seen["obs"], seen["z"] = obs, z
        return chain(obs, z, enc)

    student.teacher_chain = spy
    torch.manual_seed(3)
    loss = student.loss(mixed)["loss"]
    # The teacher labels the visited windows themselves, from the noise the student starts from: its chain from z
    # at those windows is the target, so recomputing it there reproduces the loss.
    assert torch.equal(seen["obs"]["state"], state)
    points, target = chain({"state": state}, seen["z"])
    torch.testing.assert_close(points[0], seen["z"])
    assert loss.item() > 0
    torch.manual_seed(3)
    student.teacher_chain = lambda obs, z, enc=None: (points, target)
    torch.testing.assert_close(student.loss(mixed)["loss"], loss)


def test_distill_dagger_rounds_add_the_windows_the_student_planned_from(tmp_path, teacher_run):
    import gymnasium as gym
    import numpy as np

    out = tmp_path / "student"
    args = ["distill", "--teacher", str(teacher_run), "--out", str(out), "--steps", "2", "--batch-size", "8"]
    args += ["--dagger-rounds", "1", "--dagger-episodes", "1", "--dagger-steps", "2", "--eval-envs", "1"]
    assert main(args) == 0
    rounds = tmp_path / "student-dagger"
    visited = dict(np.load(rounds / "visited.npz"))
    student, meta = load_policy(out / "checkpoint")
    to = student.chunk.n_obs_steps
    assert visited["state"].ndim == 3 and visited["state"].shape[1] == to and len(visited["state"]) >= 2
    # The first window is the one planned at the first step of seed 300000: its history padded with the reset frame.
    env = gym.make(meta["env_id"], **{**meta["env_kwargs"], "obs_modes": ("state",)})
    first, _ = env.reset(seed=300_000)
    env.close()
    for frame in visited["state"][0]:
        np.testing.assert_allclose(frame, first["state"], rtol=1e-6)
    log = [json.loads(x) for x in (rounds / "rollouts.jsonl").read_text().splitlines()]
    assert [x["round"] for x in log] == [0] and log[0]["episodes"] == 1
    # The last round continues round 0's student (not the teacher's weights) with the visited windows mixed in.
    config = json.loads((out / "config.json").read_text())
    assert config["init"] == str(rounds / "round0" / "checkpoint") and config["algo"]["from_teacher"] is False
    assert config["algo"]["visited"] == str(rounds / "visited.npz")
    assert json.loads((out / "summary.json").read_text())["train_steps"] == 2
