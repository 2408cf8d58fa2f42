"""Actor-critic algorithms over chunk policies: each owns its critic, targets and optimizers and has one update()."""

from dmrl.algos.critic import ChunkCritic, CriticConfig, chunk_td_target, polyak_update
from dmrl.algos.diffusion_ql import CriticRankedPolicy, DiffusionQL, DiffusionQLConfig
from dmrl.algos.td3_bc import TD3BC, TD3BCConfig

#: --algo name -> (algorithm class, its config dataclass, the policy it trains). "bc" is the plain BC trainer.
ALGOS: dict[str, tuple[type, type, str]] = {
    "diffusion-ql": (DiffusionQL, DiffusionQLConfig, "diffusion"),
    "td3-bc": (TD3BC, TD3BCConfig, "gaussian"),
}

__all__ = [
    "ALGOS",
    "TD3BC",
    "ChunkCritic",
    "CriticConfig",
    "CriticRankedPolicy",
    "DiffusionQL",
    "DiffusionQLConfig",
    "TD3BCConfig",
    "chunk_td_target",
    "polyak_update",
]
