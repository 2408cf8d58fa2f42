"""Chunk critic for actor-critic training of chunk policies: an ensemble of Q(s, executed action chunk) with clipped
double-Q targets (Fujimoto et al. 2018) over Ta-step returns, and the pieces every algorithm shares.

Q reads the Ta *executed* actions (chunk[To-1 : To-1+Ta], normalised), not the whole Tp chunk: only they act on the
environment between s and s' (see dmrl.data.transitions), so the other Tp - Ta predicted actions would be inputs the
return does not depend on.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dmrl.policies.base import ChunkPolicy
from dmrl.policies.observations import build_encoder, encoder_inputs


@dataclass
class CriticConfig:
    """Chunk critic: Q ensemble, discount and target speed."""

    n_critics: int = 2
    """E: Q heads; targets use their minimum (clipped double Q)."""
    hidden: int = 256
    """Width of each Q head's hidden layers."""
    depth: int = 3
    """Hidden layers per Q head."""
    layer_norm: bool = True
    """LayerNorm after each hidden layer."""
    tau: float = 0.005
    """Polyak rate of the target networks."""
    gamma: float = 0.99
    """Discount per env step (gamma ** Ta per chunk)."""
    encoder_per_member: bool = False
    """One observation encoder per Q head (independent errors) instead of one shared."""

    def __post_init__(self) -> None:
        if self.n_critics < 1 or self.hidden < 8 or self.depth < 1:
            raise ValueError(
                f"critic: need n_critics >= 1, hidden >= 8, depth >= 1; got {self.n_critics}, {self.hidden}, "
                f"{self.depth}"
            )
        if not (0.0 < self.tau <= 1.0 and 0.0 <= self.gamma <= 1.0):
            raise ValueError(f"critic: need tau in (0, 1] and gamma in [0, 1]; got tau={self.tau}, gamma={self.gamma}")


class EnsembleLinear(nn.Module):
    """E independent linear layers as one batched matmul: x (E, B, in) -> (E, B, out)."""

    def __init__(self, n: int, d_in: int, d_out: int):
        super().__init__()
        bound = 1.0 / math.sqrt(d_in)  # nn.Linear's default init, per member
        self.weight = nn.Parameter(torch.empty(n, d_in, d_out).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(n, 1, d_out).uniform_(-bound, bound))

    def forward(self, x: Tensor) -> Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class ChunkCritic(nn.Module):
    """Q(obs, executed chunk) for E heads: raw obs {key: (B, To, ...)}, normalised actions (B, Ta, Da) -> (E, B).

    Built from a policy: the same observation keys, encoder architecture (``build_encoder``) and normaliser
    statistics, but its own weights: the critic's TD gradients never move the actor's encoder. By default one
    encoder feeds all E heads (their features (B, D) are shared, the heads are independent); with
    ``encoder_per_member`` each head has its own, so the ensemble's errors are not correlated through it.
    ``with_actions=False`` builds a state-value ensemble V(obs) -> (E, B) of the same shape (IQL's V);
    ``action_rows`` reads (B, action_rows, Da) inputs instead of Ta rows (DSRL's critic of whole (Tp, Da) noises).
    """

    def __init__(
        self, policy: ChunkPolicy, config: CriticConfig, with_actions: bool = True, action_rows: int | None = None
    ):
        super().__init__()
        self.config = config
        self.chunk = policy.chunk
        self.action_dim = policy.action_dim
        self.with_actions = with_actions
        self.normalizer = copy.deepcopy(policy.normalizer)
        self.vector_keys = policy.vector_keys
        # The policy's chunk is already resolved (multimodal geometry read off the data): the same encoder shape.
        if config.encoder_per_member:
            self.encoders = nn.ModuleList(build_encoder(policy.chunk, policy.obs_dims) for _ in range(config.n_critics))
            out_dim = self.encoders[0].out_dim
        else:
            self.encoder = build_encoder(policy.chunk, policy.obs_dims)
            out_dim = self.encoder.out_dim
        rows = self.chunk.n_action_steps if action_rows is None else action_rows
        d_in = out_dim + (rows * policy.action_dim if with_actions else 0)
        dims = [d_in] + [config.hidden] * config.depth
        self.layers = nn.ModuleList(
            EnsembleLinear(config.n_critics, a, b) for a, b in zip(dims[:-1], dims[1:], strict=True)
        )
        self.out = EnsembleLinear(config.n_critics, config.hidden, 1)

    def executed(self, chunk: Tensor) -> Tensor:
        """(B, Tp, Da) chunk -> (B, Ta, Da): the actions run before replanning (index To-1 is the current step)."""
        to, ta = self.chunk.n_obs_steps, self.chunk.n_action_steps
        return chunk[:, to - 1 : to - 1 + ta]

    def executed_from_data(self, action: Tensor) -> Tensor:
        """A dataset's raw action window (B, Tp, Da) -> its executed actions (B, Ta, Da), normalised as the actor's."""
        return self.executed(self.normalizer.normalize("actions", action.float()))

    def features(self, obs: dict) -> Tensor:
        """Raw obs {key: (B, To, ...)} -> (E, B, D), normalised and encoded as the policy does (ChunkPolicy.encode);
        with one shared encoder the E rows are one tensor expanded."""
        inputs = encoder_inputs(obs, self.chunk.obs_keys, self.vector_keys, self.normalizer)

        def encode(encoder: nn.Module) -> Tensor:
            out = encoder(inputs)
            return out if isinstance(out, Tensor) else out.pooled  # (B, D)

        if self.config.encoder_per_member:
            return torch.stack([encode(e) for e in self.encoders])
        f = encode(self.encoder)
        return f.unsqueeze(0).expand(self.config.n_critics, *f.shape)

    def forward(self, obs: dict, actions: Tensor | None = None) -> Tensor:
        """obs {key: (B, To, ...)}, actions (B, Ta, Da) normalised (None for a value ensemble) -> (E, B)."""
        if (actions is None) == self.with_actions:
            raise ValueError(f"critic built with_actions={self.with_actions}: pass actions iff it reads them")
        h = self.features(obs)  # (E, B, D)
        if actions is not None:
            a = actions.flatten(1).to(h.dtype)  # (B, Ta·Da)
            h = torch.cat([h, a.unsqueeze(0).expand(h.shape[0], *a.shape)], dim=-1)  # (E, B, D + Ta·Da)
        for layer in self.layers:
            h = layer(h)
            if self.config.layer_norm:
                h = F.layer_norm(h, h.shape[-1:])  # no affine: the next layer's weights scale it
            h = F.mish(h)
        return self.out(h).squeeze(-1)


def chunk_td_target(
    reward: Tensor, done: Tensor, valid: Tensor, next_valid: Tensor, next_q: Tensor, gamma: float
) -> Tensor:
    """Ta-step target (B,) of a chunk transition (shapes as dmrl.data.ChunkTransitionDataset, with B in front):

        y = sum_k gamma^k r_k valid_k alive_k + gamma^Ta (1 - any_k done_k) next_valid min_e Q'(s', a')

    reward (B, Ta), done / valid (B, Ta) bool, next_valid (B,) bool, next_q (B,) = min over the target ensemble.
    alive_k = no done before step k: a reward after a terminal step is never counted, even if data claims it.
    """
    ta = reward.shape[1]
    not_done = 1.0 - done.float()
    alive = torch.cat([torch.ones_like(not_done[:, :1]), torch.cumprod(not_done, dim=1)[:, :-1]], dim=1)  # (B, Ta)
    discounts = gamma ** torch.arange(ta, device=reward.device, dtype=torch.float32)  # (Ta,)
    ret = (discounts * reward.float() * valid.float() * alive).sum(1)
    bootstrap = torch.cumprod(not_done, dim=1)[:, -1] * next_valid.float()  # (B,): no done anywhere, s' observed
    return ret + gamma**ta * bootstrap * next_q.float()


def td_regression(q: Tensor, y: Tensor, weights: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Critic loss and per-item TD error: q (E, B) from the online heads, y (B,) target, weights (B,) or None.

    loss = sum_e mean_b w_b (q_eb - y_b)^2 (PER's importance weights w correct the prioritised sampling bias;
    None = all ones); td_error (B,) = mean_e |q_eb - y_b|, detached: the new priority of each sampled slot.
    """
    err = q - y  # (E, B)
    sq = err.pow(2)
    if weights is not None:
        sq = sq * weights.to(sq.dtype)
    return sq.mean(1).sum(), err.detach().abs().mean(0)


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- target + tau (source - target) for trainable weights; buffers (normaliser statistics) copied."""
    pairs = [(t, s) for t, s in zip(target.parameters(), source.parameters(), strict=True) if s.requires_grad]
    if pairs:
        torch._foreach_lerp_([t for t, _ in pairs], [s.detach() for _, s in pairs], tau)
    for bt, bs in zip(target.buffers(), source.buffers(), strict=True):
        bt.copy_(bs)


def frozen_copy(module: nn.Module) -> nn.Module:
    """A target network: deep copy with no gradients."""
    return copy.deepcopy(module).requires_grad_(False)


@contextlib.contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """No gradients into ``module`` inside the block (the actor's Q term must not train the critic); weights that
    were already frozen (a pretrained backbone) stay frozen after it."""
    trainable = [p for p in module.parameters() if p.requires_grad]
    for p in trainable:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in trainable:
            p.requires_grad_(True)
