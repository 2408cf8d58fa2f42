"""Training algorithms over chunk policies: each owns its networks, targets and optimizers and has one update()."""

from dmrl.algos.bc import BC, BCConfig
from dmrl.algos.best_of_n import CriticRankedPolicy
from dmrl.algos.critic import ChunkCritic, CriticConfig, chunk_td_target, polyak_update
from dmrl.algos.diffusion_ql import DiffusionQL, DiffusionQLConfig
from dmrl.algos.distill import Distill, DistillConfig
from dmrl.algos.dppo import DPPO, DPPOConfig
from dmrl.algos.dsrl import DSRL, DSRLConfig, SteeredPolicy
from dmrl.algos.fql import FQL, FQLConfig, OneStepPolicy
from dmrl.algos.iql import IDQL, IDQLConfig
from dmrl.algos.qc import QC, QCConfig
from dmrl.algos.td3_bc import TD3BC, TD3BCConfig

#: --algo.type name -> (algorithm class, its config dataclass, the policy type it trains or None for any).
ALGOS: dict[str, tuple[type, type, str | None]] = {
    "bc": (BC, BCConfig, None),
    "diffusion-ql": (DiffusionQL, DiffusionQLConfig, "diffusion"),
    "td3-bc": (TD3BC, TD3BCConfig, "gaussian"),
    "qc": (QC, QCConfig, "diffusion"),
    "idql": (IDQL, IDQLConfig, "diffusion"),
    "fql": (FQL, FQLConfig, "diffusion"),
    "dsrl": (DSRL, DSRLConfig, "diffusion"),
    "dppo": (DPPO, DPPOConfig, "diffusion"),
    "distill": (Distill, DistillConfig, "student"),
}


def register_algo(name: str, algo_cls: type, config_cls: type, policy_type: str | None = None) -> None:
    """Make an algorithm available as ``--algo.type NAME``. ``algo_cls.build(policy, config, engine, total_steps)``
    returns the algorithm (see dmrl.algos.common for what the training loop reads); ``policy_type``: the only policy
    type it trains, or None for any."""
    if name in ALGOS:
        raise ValueError(f"algorithm {name!r} is already registered")
    if any(entry[1] is config_cls for entry in ALGOS.values()):  # a run's config names its algorithm by this class
        raise ValueError(
            f"register_algo: {config_cls.__name__} already configures another algorithm; give {name!r} its own"
        )
    if not callable(getattr(algo_cls, "build", None)):
        raise ValueError(f"register_algo: {algo_cls.__name__} needs a build(policy, config, engine, total_steps)")
    ALGOS[name] = (algo_cls, config_cls, policy_type)


__all__ = [
    "ALGOS",
    "BC",
    "DPPO",
    "DSRL",
    "FQL",
    "IDQL",
    "QC",
    "TD3BC",
    "BCConfig",
    "ChunkCritic",
    "CriticConfig",
    "CriticRankedPolicy",
    "DiffusionQL",
    "DiffusionQLConfig",
    "Distill",
    "DistillConfig",
    "DPPOConfig",
    "DSRLConfig",
    "FQLConfig",
    "IDQLConfig",
    "OneStepPolicy",
    "QCConfig",
    "SteeredPolicy",
    "TD3BCConfig",
    "chunk_td_target",
    "polyak_update",
    "register_algo",
]
