"""Policies: observation dict -> action chunk. One interface: ``loss(batch)``, ``act(obs)``, ``reset()``."""

from dmrl.policies.base import ChunkConfig, ChunkPolicy, NormalizerModule
from dmrl.policies.diffusion import DiffusionPolicy, DiffusionPolicyConfig
from dmrl.policies.gaussian import GaussianPolicy, GaussianPolicyConfig
from dmrl.policies.student import StudentPolicy, StudentPolicyConfig
from dmrl.policies.vae import VAEPolicy, VAEPolicyConfig

#: name -> (policy class, its config dataclass); a plain dict, no class lookup by string rewriting.
POLICIES: dict[str, tuple[type[ChunkPolicy], type]] = {
    "diffusion": (DiffusionPolicy, DiffusionPolicyConfig),
    "gaussian": (GaussianPolicy, GaussianPolicyConfig),
    "vae": (VAEPolicy, VAEPolicyConfig),
    "student": (StudentPolicy, StudentPolicyConfig),
}


def register_policy(name: str, policy_cls: type[ChunkPolicy], config_cls: type) -> None:
    """Make a policy class available as ``--policy.type NAME`` (training, checkpoints, evaluation).

    ``policy_cls(chunk, config, obs_dims, action_dim, normalizer, text_encoder)`` subclasses ChunkPolicy with
    ``name = NAME`` and implements ``loss(batch)`` and ``sample_chunk(cond, cond_mask, grad_steps)``.
    """
    if name in POLICIES:
        raise ValueError(f"policy {name!r} is already registered")
    if any(entry[1] is config_cls for entry in POLICIES.values()):  # a run's config names its policy by this class
        raise ValueError(
            f"register_policy: {config_cls.__name__} already configures another policy; give {name!r} its own"
        )
    if getattr(policy_cls, "name", None) != name:
        raise ValueError(
            f"register_policy: {policy_cls.__name__}.name is {getattr(policy_cls, 'name', None)!r}, not {name!r}"
        )
    POLICIES[name] = (policy_cls, config_cls)


def build_policy(
    name: str, chunk: ChunkConfig, config, obs_dims: dict, action_dim: int, normalizer=None, text_encoder=None
):
    """POLICIES[name] built from its config; an unknown name is a one-line error.

    obs_dims {vector key: length, frame key: (C, H, W)}; text_encoder: optional prebuilt LanguageEncoder to share.
    """
    if name not in POLICIES:
        raise ValueError(f"policy: got {name!r}; allowed: {', '.join(POLICIES)}")
    return POLICIES[name][0](chunk, config, obs_dims, action_dim, normalizer, text_encoder)


__all__ = [
    "POLICIES",
    "ChunkConfig",
    "ChunkPolicy",
    "DiffusionPolicy",
    "DiffusionPolicyConfig",
    "GaussianPolicy",
    "GaussianPolicyConfig",
    "NormalizerModule",
    "StudentPolicy",
    "StudentPolicyConfig",
    "VAEPolicy",
    "VAEPolicyConfig",
    "build_policy",
    "register_policy",
]
