"""``dmrl eval`` (a command: it sees every layer, the ONNX planner included): evaluate a checkpoint on fixed seeds;
writes eval.json, a path plot and a rollout GIF."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from dmrl.envs import env_spec
from dmrl.envs.language import SPLITS
from dmrl.paths import check_output_path
from dmrl.types import OBS_MODES

log = logging.getLogger(__name__)


@dataclass
class EvalConfig:
    """``dmrl eval --checkpoint RUN/checkpoint``."""

    checkpoint: Path
    """A checkpoint directory (policy.safetensors + config.json), e.g. runs/bc/checkpoint."""
    episodes: int = 100
    """Evaluation episodes, one per seed: seed, seed + 1, ..."""
    seed: int = 100_000
    """First evaluation seed (collection uses 0, 1, ...: keep them apart)."""
    envs: int = 4
    """Environments stepped in lockstep, each in its own process."""
    env: str | None = None
    """Environment id; default: the one the policy was trained on."""
    paraphrases: str = "train"
    """Instruction paraphrases at reset: train, heldout or all."""
    inference_steps: int | None = None
    """Override the diffusion policy's DDIM steps."""
    action_steps: int | None = None
    """Override Ta, the actions executed from each chunk before replanning (receding horizon): 1 .. Tp - To + 1
    of the checkpoint's chunk. Reported as n_action_steps in eval.json."""
    onnx: Path | None = None
    """Plan chunks with this exported graph (``dmrl export``) in onnxruntime instead of torch; the checkpoint still
    gives the settings, the history and the action queue. Reported as planner in eval.json."""
    drop_modality: tuple[str, ...] = ()
    """Modalities withheld from the policy (e.g. --drop-modality depth, or several: rgb depth); its multimodal
    encoder masks them. The env is unchanged. Reported as dropped_modalities in eval.json."""
    out: Path | None = None
    """Output directory; default: <checkpoint>/../eval, or eval_drop-<names> with --drop-modality."""
    gif_episodes: int = 2
    """Episodes rendered into rollouts.gif (0: none)."""
    cpu_threads: int = 1
    """torch threads for the policy (1: no OpenMP spin-waiting next to the env worker processes)."""

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.envs < 1:
            raise ValueError(f"--episodes and --envs must be >= 1, got {self.episodes} and {self.envs}")
        if self.seed < 0 or self.gif_episodes < 0:
            raise ValueError(f"--seed and --gif-episodes must be >= 0, got {self.seed} and {self.gif_episodes}")
        if self.paraphrases not in SPLITS:
            raise ValueError(f"--paraphrases: got {self.paraphrases!r}; allowed: {', '.join(SPLITS)}")
        if self.env is not None:
            env_spec(self.env)  # one-line error naming the registered envs
        self.drop_modality = tuple(dict.fromkeys(m.strip() for part in self.drop_modality for m in part.split(",")))
        bad = [m for m in self.drop_modality if m not in OBS_MODES]
        if bad:
            raise ValueError(f"--drop-modality: got {bad[0]!r}; allowed: {', '.join(OBS_MODES)}")


def run_eval(cfg: EvalConfig) -> dict:
    from dmrl.envs.plotting import save_path_plot
    from dmrl.policies.checkpoint import load_policy
    from dmrl.train.engine import configure_cpu_threads
    from dmrl.train.evaluate import check_drop, evaluate, measure_latency, save_rollout_gif, set_action_steps

    configure_cpu_threads(cfg.cpu_threads)
    policy, meta = load_policy(cfg.checkpoint)
    if cfg.inference_steps is not None:
        if not hasattr(policy, "set_sampler"):
            raise ValueError(f"--inference-steps applies to diffusion policies; {cfg.checkpoint} is {policy.name}")
        policy.set_sampler(cfg.inference_steps)
    if cfg.action_steps is not None:
        set_action_steps(policy, cfg.action_steps)
    if cfg.onnx is not None:
        from dmrl.export import OnnxPlanner

        if cfg.drop_modality:
            raise ValueError("--drop-modality with --onnx: the exported graph reads every modality; evaluate in torch")

        # A graph that reads an instruction takes its embedding: the checkpoint's LanguageEncoder makes it.
        text = getattr(policy.encoder, "text_encoder", None)
        policy.set_planner(OnnxPlanner(cfg.onnx, threads=cfg.cpu_threads, text_encoder=text))
    drop = check_drop(policy, cfg.drop_modality)
    env_id = cfg.env or meta.get("env_id", "dmrl/MultiPathGrasp-v0")
    # The training store's image size / cameras / cups (meta.env_kwargs) so observations match the policy.
    spec = env_spec(env_id)
    paraphrases = {"paraphrases": cfg.paraphrases} if "paraphrases" in (spec.options or ()) else {}
    env_kwargs = {**paraphrases, **meta.get("env_kwargs", {})}
    default_dir = "eval_drop-" + "-".join(drop) if drop else "eval"
    out = cfg.out or Path(cfg.checkpoint).parent / default_dir
    check_output_path(out)  # before the evaluation, not after it
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(range(cfg.seed, cfg.seed + cfg.episodes))
    result = evaluate(policy, env_id, seeds, env_kwargs, n_envs=cfg.envs, drop=drop)
    result.latency_ms, result.latency_p95_ms = measure_latency(policy, env_id, env_kwargs, drop=drop)
    summary = {
        "checkpoint": str(cfg.checkpoint),
        "env_id": env_id,
        "policy": policy.name,
        "obs_keys": list(policy.chunk.obs_keys),
        "dropped_modalities": list(drop),
        "n_action_steps": policy.chunk.n_action_steps,
        "planner": f"onnxruntime:{cfg.onnx}" if cfg.onnx is not None else "torch",
        "seeds": [seeds[0], seeds[-1]],
        **result.summary(),
    }
    (out / "eval.json").write_text(json.dumps(summary, indent=2))
    task = spec.extra.get("multipath_task")  # the path plot and the GIF draw MultiPath's scene
    if task is not None:
        save_path_plot(
            [r.tip_path for r in result.records],
            [r.route for r in result.records],
            task,
            out / "paths.png",
            title=f"{policy.name}: {result.success_rate:.0%} success" + (f" without {', '.join(drop)}" if drop else ""),
        )
    gif = cfg.gif_episodes > 0 and task is not None
    if gif:
        save_rollout_gif(policy, env_id, out / "rollouts.gif", seeds[: cfg.gif_episodes], env_kwargs, drop=drop)
    print(json.dumps(summary, indent=2))
    log.info("wrote %s/eval.json%s%s", out, ", paths.png" if task is not None else "", ", rollouts.gif" if gif else "")
    return summary
