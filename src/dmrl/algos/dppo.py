"""DPPO (Ren et al. 2024): PPO over the denoising steps of a diffusion policy, with a state-value critic.

Each decision of the policy is a small MDP of S denoising steps: from x_S ~ N(0, I) every step draws
x_{i+1} ~ N(mu_theta(x_i, s, i), std_i^2), a Gaussian with the stochastic DDIM sampler's mean (eta 1) and its std
clipped from below at ``min_std`` (the last steps' std would be ~0: no exploration, no likelihood). The chunk x_S' is
executed, and the env's chunk reward rewards every one of its S steps. So each denoising step is an action with an
exact Gaussian log-likelihood, and PPO's clipped ratio objective applies to it unchanged:

    A_d       GAE(lambda) of decision d over chunk rewards, with V(s) the critic (its baseline and bootstrap)
    A_{d,i}   A_d · gamma_denoising^(S-1-i)   (the steps nearest the action matter most)
    ratio     exp(log pi_theta(x_{i+1} | x_i, s) - log pi_old(x_{i+1} | x_i, s))
    loss      -mean min(ratio · A, clip(ratio, 1 ± eps_i) · A),  V regressed on the GAE returns

eps_i grows from ``clip_ratio_first`` at the noisiest step to ``clip_ratio`` at the last, as in DPPO.

The critic steers: which sampled chunks become more likely is decided by V's advantage estimates (its baseline and
bootstrap inside GAE). Nothing is read off the data's support: the
policy moves only towards chunks it sampled itself, a small clipped step at a time. Log-likelihoods read only the
Ta executed rows of each chunk (the other rows never reach the env, so the return says nothing about them).

The actor's own sampler is set to that chain without noise (``ddim_eta`` 1, ``ddim_noise_scale`` 0): evaluation,
the checkpoint, ``dmrl eval`` and the ONNX export all act with each step's mean. Rollouts come from
dmrl.train.onpolicy (``--source.type rollout``); ``update(rollout)`` is one PPO iteration:
GAE, then ``epochs`` passes of minibatches over the (decision, denoising step) pairs of the last ``ft_steps`` steps
(all S by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from dmrl.algos.common import Stepper
from dmrl.algos.critic import ChunkCritic, CriticConfig
from dmrl.diffusion import DDIMSampler
from dmrl.diffusion.prediction import split_with_coefficients
from dmrl.policies.diffusion import DiffusionPolicy


def value_critic() -> CriticConfig:
    return CriticConfig(n_critics=1, encoder_per_member=False)


@dataclass
class DPPOConfig:
    """DPPO: exploration noise of the denoising chain, PPO's clipping and passes, GAE, learning rates."""

    actor_lr: float = 1e-4
    """Adam learning rate of the diffusion policy."""
    critic_lr: float = 1e-3
    """Adam learning rate of V(s)."""
    min_std: float = 0.1
    """Lower bound of every denoising step's std (normalised action units): exploration and a finite likelihood."""
    clip_ratio: float = 0.01
    """PPO's clip on the likelihood ratio of the last denoising step (the one that makes the executed chunk)."""
    clip_ratio_first: float = 0.001
    """The clip of the first denoising step; steps between grow exponentially towards clip_ratio (DPPO's schedule:
    the noisiest steps move least)."""
    epochs: int = 10
    """Passes over each rollout."""
    minibatch: int = 1000
    """(decision, denoising step) pairs per gradient step."""
    gae_lambda: float = 0.95
    """GAE's lambda over decisions."""
    gamma_denoising: float = 0.99
    """Discount of a decision's advantage per denoising step away from the executed chunk."""
    ft_steps: int = 0
    """Denoising steps whose (x_i, x_{i+1}) pairs train the actor, counted back from the last (0: all S). The early
    steps of an x0-predicting chain barely move the executed chunk, so their likelihood ratios carry noise, not
    signal; the chain still samples them (with the same network) and explores through them."""
    critic_warmup: int = 2
    """First rollouts that train V only (a random V's advantages would steer at random)."""
    target_kl: float = 0.0
    """Stop an iteration's passes once the approximate KL of a minibatch exceeds this (0: never)."""
    critic: CriticConfig = field(default_factory=value_critic)
    """V(s): its network; gamma is the per-env-step discount (gamma ** Ta per decision)."""

    def __post_init__(self) -> None:
        if min(self.actor_lr, self.critic_lr, self.min_std, self.clip_ratio, self.clip_ratio_first) <= 0:
            raise ValueError(
                f"--algo: need actor_lr, critic_lr, min_std, clip_ratio, clip_ratio_first > 0; got {self.actor_lr}, "
                f"{self.critic_lr}, {self.min_std}, {self.clip_ratio}, {self.clip_ratio_first}"
            )
        if self.epochs < 1 or self.minibatch < 1 or min(self.critic_warmup, self.target_kl, self.ft_steps) < 0:
            raise ValueError(
                f"--algo: need epochs >= 1, minibatch >= 1, critic_warmup, target_kl, ft_steps >= 0; got "
                f"{self.epochs}, {self.minibatch}, {self.critic_warmup}, {self.target_kl}, {self.ft_steps}"
            )
        if not (0.0 <= self.gae_lambda <= 1.0 and 0.0 < self.gamma_denoising <= 1.0):
            raise ValueError(
                f"--algo: need gae_lambda in [0, 1] and gamma_denoising in (0, 1]; got {self.gae_lambda}, "
                f"{self.gamma_denoising}"
            )
        if isinstance(self.critic, dict):
            self.critic = CriticConfig(**self.critic)


def gae(reward: Tensor, value: Tensor, done: Tensor, next_value: Tensor, gamma: float, lam: float) -> Tensor:
    """Advantages (T, N) from reward, value, done (T, N) and next_value (N,): V after the last decision.

    done[t] ends the episode after decision t (no bootstrap across it; a truncated episode's bootstrap is already in
    its reward). Schulman et al. 2016: A_t = sum_k (gamma lam)^k delta_{t+k}, delta_t = r_t + gamma V_{t+1} - V_t.
    """
    adv = torch.zeros_like(reward)
    last = torch.zeros_like(next_value)
    for t in reversed(range(reward.shape[0])):
        cont = 1.0 - done[t].float()
        nxt = next_value if t == reward.shape[0] - 1 else value[t + 1]
        delta = reward[t] + gamma * nxt * cont - value[t]
        last = delta + gamma * lam * cont * last
        adv[t] = last
    return adv


class DPPO(nn.Module):
    """The diffusion actor (exported as it is), V(s), their optimizers and the denoising chain they explore with.
    Batches: rollouts of dmrl.train.onpolicy (``batches = "rollouts"``)."""

    batches = "rollouts"

    def __init__(self, actor: DiffusionPolicy, value: ChunkCritic, config: DPPOConfig, engine: Stepper):
        super().__init__()
        if not isinstance(actor, DiffusionPolicy):
            raise ValueError(f"dppo fine-tunes a diffusion policy's chain; got policy {actor.name!r}")
        self.config, self.engine = config, engine
        self.actor, self.value = actor, value
        # The actor acts (evaluation, the checkpoint, dmrl eval, ONNX) with the chain it is trained as, without its
        # noise: eta 1's coefficients, each step's mean.
        actor.config.ddim_eta, actor.config.ddim_noise_scale = 1.0, 0.0
        actor.set_sampler(actor.sampler.num_steps)
        s = actor.sampler
        # eta 1: every step a Gaussian whose std is the DDPM posterior's between the visited timesteps (clipped).
        self.chain = DDIMSampler(actor.schedule, num_steps=s.num_steps, eta=1.0, pred_type=s.pred_type,
                                 clip_sample=True, timestep_spacing=actor.config.timestep_spacing)  # fmt: skip
        self.std = self.chain.sigma.clamp(min=config.min_std)  # (S,)
        n = s.num_steps
        if config.ft_steps > n:
            raise ValueError(
                f"--algo.ft-steps {config.ft_steps}: the chain has {n} steps (--policy.num-inference-steps)"
            )
        grow = (torch.exp(3.0 * torch.arange(n) / max(n - 1, 1)) - 1) / (math.exp(3.0) - 1) if n > 1 else torch.ones(1)
        self.clip = config.clip_ratio_first + (config.clip_ratio - config.clip_ratio_first) * grow  # (S,)
        self.actor_opt = torch.optim.Adam([p for p in actor.parameters() if p.requires_grad], lr=config.actor_lr)
        self.critic_opt = torch.optim.Adam(value.parameters(), lr=config.critic_lr)
        self.register_buffer("env_steps", torch.zeros((), dtype=torch.long))  # resumable: the budget's counter
        self.n_updates = 0
        engine.prepare(self)

    @classmethod
    def build(cls, policy: DiffusionPolicy, config: DPPOConfig, engine: Stepper, total_steps: int) -> DPPO:
        policy.to(engine.device)
        return cls(policy, ChunkCritic(policy, config.critic, with_actions=False).to(engine.device), config, engine)

    @property
    def policy(self) -> DiffusionPolicy:
        return self.actor

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_opt, "critic": self.critic_opt}

    def evaluation_policy(self) -> DiffusionPolicy:
        """The actor, whose sampler runs the fine-tuned chain without its noise (each step's mean)."""
        return self.actor

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self.chain = self.chain.to(self.actor.normalizer.actions_scale.device)
        self.std, self.clip = self.std.to(self.chain.device), self.clip.to(self.chain.device)
        return out

    # ------------------------------------------------------------------ the chain as a policy
    def step_mean(self, x: Tensor, i: Tensor, cond: Tensor, cond_mask: Tensor | None = None) -> Tensor:
        """mu_theta: x (B, Tp, Da) at loop indices i (B,) long, cond (B, D) -> the step's mean (B, Tp, Da)."""
        c = self.chain
        out = self.actor.denoise_fn(cond, cond_mask)(x, c.timesteps[i])
        col = (slice(None), None, None)
        x0, eps = split_with_coefficients(c.pred_type, out, x, c.sqrt_ab[i][col], c.sqrt_one_minus_ab[i][col])
        return c.c_x0[i][col] * x0.clamp(-c.clip_range, c.clip_range) + c.c_eps[i][col] * eps

    def log_prob(self, mean: Tensor, x_next: Tensor, i: Tensor) -> Tensor:
        """Mean log-density (B,) of x_next under N(mean, std_i^2) over the executed rows, clamped per entry to
        [-5, 2] as DPPO does (one wild entry must not decide the ratio)."""
        to, ta = self.actor.chunk.n_obs_steps, self.actor.chunk.n_action_steps
        rows = slice(to - 1, to - 1 + ta)
        std = self.std[i][:, None, None]
        z = (x_next[:, rows] - mean[:, rows]) / std
        lp = -0.5 * z.pow(2) - std.log() - 0.5 * math.log(2 * math.pi)
        return lp.clamp(-5.0, 2.0).mean(dim=(1, 2))

    @torch.no_grad()
    def explore(self, obs: dict) -> dict[str, Tensor]:
        """Raw obs {key: (B, To, ...)} -> {"chain" (B, S+1, Tp, Da) normalised (x_0 first, the executed chunk
        last), "log_prob" (B, S), "value" (B,)}: one stochastic pass of the chain and V(s)."""
        cond, mask = self.actor.condition(obs)
        b, n = cond.shape[0], self.chain.num_steps
        x = torch.randn(b, self.actor.chunk.horizon, self.actor.action_dim, device=cond.device)
        xs, lps = [x], []
        for i in range(n):
            idx = torch.full((b,), i, dtype=torch.long, device=cond.device)
            mean = self.step_mean(x, idx, cond, mask)
            x = mean + self.std[i] * torch.randn_like(mean)
            lps.append(self.log_prob(mean, x, idx))
            xs.append(x)
        return {"chain": torch.stack(xs, 1), "log_prob": torch.stack(lps, 1), "value": self.state_value(obs)}

    @torch.no_grad()
    def state_value(self, obs: dict) -> Tensor:
        """V(s) (B,) of raw obs {key: (B, To, ...)}."""
        return self.value(obs)[0].float()

    # ------------------------------------------------------------------ one PPO iteration
    def update(self, rollout: dict) -> dict[str, Any]:
        """One iteration on a rollout of T decisions in N envs: obs {key: (T, N, To, ...)}, chain (T, N, S+1, Tp,
        Da), log_prob (T, N, S), value, reward, done (T, N), next_value (N,). GAE, then ``epochs`` passes of
        clipped-ratio minibatches over the T·N·K denoising steps trained (K = ft_steps or S) and V on the returns."""
        cfg = self.config
        gamma = cfg.critic.gamma**self.actor.chunk.n_action_steps
        adv = gae(rollout["reward"], rollout["value"], rollout["done"], rollout["next_value"], gamma, cfg.gae_lambda)
        ret = (adv + rollout["value"]).flatten()  # (T·N,)
        adv = adv.flatten()
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        obs = {k: v.flatten(0, 1) for k, v in rollout["obs"].items()}
        chain, old_lp = rollout["chain"].flatten(0, 1), rollout["log_prob"].flatten(0, 1)  # (D, S+1, ...), (D, S)
        d, s = old_lp.shape
        n_ft = cfg.ft_steps or s
        step_weight = cfg.gamma_denoising ** torch.arange(s - 1, -1, -1, device=adv.device)  # (S,)
        train_actor = self.n_updates >= cfg.critic_warmup
        sums: dict[str, float] = {}
        count, stop = 0, False
        for _ in range(cfg.epochs):
            perm = torch.randperm(d * n_ft, device=adv.device)
            for lo in range(0, d * n_ft, cfg.minibatch):
                pick = perm[lo : lo + cfg.minibatch]
                dec, i = pick // n_ft, s - n_ft + pick % n_ft
                mb = {
                    "obs": {k: v[dec] for k, v in obs.items()},
                    "x": chain[dec, i], "x_next": chain[dec, i + 1], "i": i,
                    "old_lp": old_lp[dec, i], "adv": adv[dec] * step_weight[i], "ret": ret[dec],
                }  # fmt: skip
                logs = self.engine.backward(self.value_loss, mb)
                logs["critic_grad_norm"] = self.engine.step(self.critic_opt)["grad_norm"]
                if train_actor:
                    logs |= self.engine.backward(self.policy_loss, mb)
                    logs["actor_grad_norm"] = self.engine.step(self.actor_opt)["grad_norm"]
                for k, v in logs.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                count += 1
                if train_actor and cfg.target_kl and float(logs["approx_kl"]) > cfg.target_kl:
                    stop = True
                    break
            if stop:
                break
        self.n_updates += 1
        out: dict[str, Any] = {k: v / count for k, v in sums.items()}
        out |= {"passes": count, "return_mean": float(ret.mean()), "actor_trained": float(train_actor)}
        return out

    def value_loss(self, mb: dict) -> dict[str, Tensor]:
        v = self.value(mb["obs"])[0].float()
        loss = 0.5 * (v - mb["ret"]).pow(2).mean()
        return {"loss": loss, "critic_loss": loss.detach(), "v": v.mean().detach()}

    def policy_loss(self, mb: dict) -> dict[str, Tensor]:
        # fp32 whatever the engine's autocast: the old log-probs were computed in fp32, and a ratio clipped at
        # 1 ± 0.001 must not move by rounding alone.
        with torch.autocast(mb["x"].device.type, enabled=False):
            cond, mask = self.actor.condition(mb["obs"])
            lp = self.log_prob(self.step_mean(mb["x"], mb["i"], cond.float(), mask), mb["x_next"], mb["i"])
        log_ratio = lp - mb["old_lp"]
        ratio = log_ratio.exp()
        eps = self.clip[mb["i"]]  # (B,)
        clipped = torch.minimum(torch.maximum(ratio, 1 - eps), 1 + eps)
        loss = -torch.minimum(ratio * mb["adv"], clipped * mb["adv"]).mean()
        with torch.no_grad():
            kl = ((ratio - 1) - log_ratio).mean()  # Schulman's k3 estimator of KL(old || new)
            frac = ((ratio - 1).abs() > eps).float().mean()
        return {"loss": loss, "policy_loss": loss.detach(), "approx_kl": kl, "clip_fraction": frac}
