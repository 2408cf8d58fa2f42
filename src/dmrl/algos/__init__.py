"""Training algorithms over chunk policies: each owns its networks, targets and optimizers and has one update()."""

from dmrl.algos.bc import BC, BCConfig
from dmrl.algos.critic import ChunkCritic, CriticConfig, chunk_td_target, polyak_update
from dmrl.algos.diffusion_ql import CriticRankedPolicy, DiffusionQL, DiffusionQLConfig
from dmrl.algos.td3_bc import TD3BC, TD3BCConfig

#: --algo.type name -> (algorithm class, its config dataclass, the policy type it trains or None for any).
ALGOS: dict[str, tuple[type, type, str | None]] = {
    "bc": (BC, BCConfig, None),
    "diffusion-ql": (DiffusionQL, DiffusionQLConfig, "diffusion"),
    "td3-bc": (TD3BC, TD3BCConfig, "gaussian"),
}

__all__ = [
    "ALGOS",
    "BC",
    "TD3BC",
    "BCConfig",
    "ChunkCritic",
    "CriticConfig",
    "CriticRankedPolicy",
    "DiffusionQL",
    "DiffusionQLConfig",
    "TD3BCConfig",
    "chunk_td_target",
    "polyak_update",
]
