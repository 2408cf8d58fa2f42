"""IDQL (Hansen-Estruch et al. 2023) with IQL's critic (Kostrikov et al. 2022): Q and V are fitted on dataset chunks
alone (V by expectile regression on Q, Q on r + gamma^Ta V(s')), so no actor sample ever enters training; the
behaviour-cloned diffusion proposal's samples are chosen by Q at act time (best-of-N, as QC: dmrl.algos.qc).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from dmrl.algos.common import Stepper
from dmrl.algos.critic import ChunkCritic, chunk_td_target, td_regression
from dmrl.algos.qc import BCProposalCritic, ProposalConfig
from dmrl.policies.diffusion import DiffusionPolicy


@dataclass
class IDQLConfig(ProposalConfig):
    """IDQL: IQL critic and value fitted on data chunks only, best-of-N acting over the BC proposal's samples."""

    expectile: float = 0.7
    """IQL's tau: V(s) is this expectile of Q(s, a_data) (0.5: the mean, toward 1: the max)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.5 <= self.expectile < 1.0:
            raise ValueError(f"--algo.expectile: got {self.expectile}; allowed [0.5, 1)")


def expectile_loss(diff: Tensor, expectile: float) -> Tensor:
    """IQL's asymmetric squared loss of diff = target - prediction: |tau - 1(diff < 0)| diff^2, mean over items."""
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    return (weight * diff.pow(2)).mean()


class IDQL(BCProposalCritic):
    """IDQL with IQL's critic: Q and V never read a chunk that is not in the data."""

    config: IDQLConfig

    def __init__(self, actor: DiffusionPolicy, critic: ChunkCritic, config: IDQLConfig, engine: Stepper):
        value = ChunkCritic(actor, dataclasses.replace(critic.config, n_critics=1), with_actions=False)
        super().__init__(actor, critic, config, engine, value.to(next(critic.parameters()).device))

    def critic_loss(self, batch: dict) -> dict[str, Tensor]:
        """Expectile regression of V(s) on min_e Q'(s, a_data), plus Q(s, a_data) on r + gamma^Ta V(s')."""
        with torch.no_grad():
            q_target = self.critic_target(batch["obs"], self.critic.executed_from_data(batch["action"]))
            q_target = q_target.min(0).values.float()  # (B,)
            next_v = self.value(batch["next_obs"])[0].float()  # (B,); V has no target net in IQL
            y = chunk_td_target(batch["reward"], batch["done"], batch["valid"], batch["next_valid"], next_v,
                                self.critic.config.gamma)  # fmt: skip
        v = self.value(batch["obs"])[0].float()  # (B,)
        v_loss = expectile_loss(q_target - v, self.config.expectile)
        q = self.data_q(batch)  # (E, B)
        q_loss, td_error = td_regression(q, y, batch.get("weights"))
        return {"loss": q_loss + v_loss, "q": q.mean().detach(), "v": v.mean().detach(), "target": y.mean(),
                "v_loss": v_loss.detach(), "td_error": td_error}  # fmt: skip
