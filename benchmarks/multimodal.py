"""Policies from rgb + depth + joints + force + instruction on MultiPathGrasp, no privileged state as input (issue 4).

Run: ``python benchmarks/multimodal.py [--arms main concat lm_last_layer gaussian vae] [--episodes 100]``.
It collects outputs/multimodal/dataset_recovery.zarr first if it is not there (300 expert episodes, 64 px front camera,
3 cups, train paraphrases, then 100 recovery episodes: ``dmrl collect --miss-prob 1``, each starting where the expert
notices that its first grasp, aimed off the cup on purpose, grabbed nothing). Each arm trains the preset
(``--config``, default configs/grasp_multimodal_cpu.yaml) with one change, then is evaluated on seeds 100000.. with
train and with held-out instruction paraphrases:

    main           the preset: Perceiver fusion, frozen MiniLM, diffusion policy
    concat         fusion: pooled features concatenated + MLP (the seed's weakest fusion)
    lm_last_layer  MiniLM's last transformer layer fine-tuned instead of frozen
    gaussian, vae  the MLP and VAE policies on the same encoder, data and steps (the seed's table, multimodal)
    no_aux         without the preset's auxiliary head (chunk.aux_state: predicting the named cup's position from
                   the pooled condition at training time; the policy never reads the state)

Each evaluation also records where the first grasp went (grasp_target / grasp_wrong / grasp_none: the named cup,
another, none); ``--action-steps N`` evaluates with Ta = N instead of the checkpoint's (chosen on validation seeds
with ``dmrl eval --seed 200000 --action-steps N``, never on these).
``main`` is also evaluated with each modality withheld at test time (train paraphrases, --drop-episodes each), and
its auxiliary head is probed on --binding-scenes fresh scenes per paraphrase set (benchmarks/mm_binding.py: is the
cup nearest the predicted position the named one?). The dataset stores the privileged state as well, only as the
auxiliary head's training target.
A finished run with the same settings is reused, and the results of arms not run this time are kept, so arms can
be added one invocation at a time. Writes benchmarks/results/multimodal.json and .md; entries ``train_paraphrases``
and ``heldout_paraphrases`` are the main arm's. ``--smoke`` runs tiny networks for a few steps and writes nothing
to benchmarks/results (a check that the pipeline runs, not a result).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from _common import RESULTS, machine, parse_args, write_results
from _rl import finished, template
from dmrl.config_utils import merge
from dmrl.train.config import TrainConfig
from mm_binding import TARGET_XYZ, binding

ROOT = Path(__file__).resolve().parents[1]
DATASET = ROOT / "outputs" / "multimodal" / "dataset_recovery.zarr"
MODES = ("rgb", "depth", "joints", "force", "instruction")
ARMS: dict[str, dict] = {
    "main": {},
    "concat": {"chunk": {"encoder": {"fusion": "concat"}}},
    "lm_last_layer": {"chunk": {"encoder": {"language": {"trainable_layers": 1}}}},
    "gaussian": {"policy": "gaussian"},
    "vae": {"policy": "vae"},
    "no_aux": {"chunk": {"aux_state": []}},
}
Arm = Literal[tuple(ARMS)]  # --arms choices
Mode = Literal[MODES]  # --drop choices
# --smoke: one block per network, D = 32, frozen MiniLM, a few steps of 8.
SMOKE = {
    "steps": 4,
    "batch_size": 8,
    "source": {"cache_images": False},
    "chunk": {
        "encoder": {
            "dim": 32,
            "vit": {"width": 32, "depth": 1, "n_heads": 2},
            "depth": {"width": 16, "depth": 1, "n_heads": 2},
            "perceiver": {"n_latents": 4, "n_heads": 2, "n_layers": 1},
            "language": {"out_dim": 32, "trainable_layers": 0},
        },
    },
}
COLUMNS = [
    "entry",
    "paraphrases",
    "dropped",
    "episodes",
    "success_rate",
    "ci_low",
    "ci_high",
    "collision_rate",
    "route_left",
    "route_right",
    "grasp_target",
    "grasp_wrong",
    "grasp_none",
    "recovery_episodes",
    "action_steps",
    "bound",
    "chance",
    "xy_error_cm",
    "train_minutes",
    "samples_per_s",
    "git_commit",
]


def collect_if_missing(path: Path, episodes: int, recovery: int, image_size: int, check_size: bool = True) -> int:
    """Collect the dataset at ``path`` unless it is there (then check it) -> how many recovery episodes it holds."""
    from dmrl.data import EpisodeStore
    from dmrl.data.collect import CollectConfig, collect

    if not path.exists():
        modes = (*MODES, "state")  # state: the auxiliary head's training target, never a policy input
        kw = dict(out=path, obs_modes=modes, image_size=image_size, workers=2)
        collect(CollectConfig(episodes=episodes, **kw))
        if recovery:
            collect(CollectConfig(episodes=recovery, miss_prob=1.0, append=True, **kw))
        return recovery_episodes(EpisodeStore.open(path))
    store = EpisodeStore.open(path)
    if "state" not in store.obs_modes:
        sys.exit(f"--dataset {path}: collected without state (the aux head's target); delete it and rerun to recollect")
    n_recovery = recovery_episodes(store)
    held = (store.n_episodes - n_recovery, n_recovery)
    if check_size and held != (episodes, recovery):  # else a finished run on it would be reused as if trained on it
        sys.exit(
            f"--dataset {path}: holds {held[0]} expert + {held[1]} recovery episodes, --collect-episodes / "
            f"--recovery-episodes ask for {episodes} / {recovery}; delete it to recollect, or pass "
            f"--collect-episodes {held[0]} --recovery-episodes {held[1]}"
        )
    return n_recovery


def recovery_episodes(store) -> int:
    """How many of an EpisodeStore's episodes are recovery episodes (collected with --miss-prob, info["first_step"])."""
    return sum("first_step" in info for info in store.infos())


def arm_config(args: Args, arm: str) -> TrainConfig:
    cfg = template(args.config, **ARMS[arm])  # the preset with the arm's change, nested keys merged one by one
    if args.steps:
        cfg = merge(cfg, {"steps": args.steps})
    if args.smoke:
        cfg = merge(cfg, SMOKE)
        if cfg.policy_type == "diffusion":
            cfg = merge(cfg, {"policy": {"denoiser_kwargs": {"hidden_dim": 32, "n_blocks": 1}}})
    return merge(cfg, {"dataset": args.dataset, "out": args.out / (f"smoke_{arm}" if args.smoke else arm)})


def evaluate_arm(args: Args, arm: str, cfg: TrainConfig, summary: dict, n_recovery: int) -> list[dict]:
    from dmrl.policies.checkpoint import load_policy
    from dmrl.train.evaluate import evaluate, set_action_steps

    policy, meta = load_policy(cfg.out / "checkpoint")
    if args.action_steps:
        set_action_steps(policy, args.action_steps)
    n_main = 2 if args.smoke else args.episodes
    n_abl = 2 if args.smoke else args.ablation_episodes
    n_drop = 2 if args.smoke else args.drop_episodes
    plan = [("train", (), n_main if arm == "main" else n_abl), ("heldout", (), n_main if arm == "main" else n_abl)]
    if arm == "main":
        plan += [("train", (m,), n_drop) for m in args.drop]
    rows = []
    for paraphrases, drop, n in plan:
        seeds = list(range(100_000, 100_000 + n))
        kwargs = {**meta["env_kwargs"], "paraphrases": paraphrases}
        ev = evaluate(policy, meta["env_id"], seeds, kwargs, n_envs=1 if args.smoke else 2, drop=drop)
        if arm == "main" and not drop:
            entry = f"{paraphrases}_paraphrases"
        else:
            entry = f"{arm}_drop_{drop[0]}" if drop else f"{arm}_{paraphrases}"
        rows.append(
            {
                "entry": entry,
                "paraphrases": paraphrases,
                "dropped": ",".join(drop) or "none",
                "episodes": ev.episodes,
                "success_rate": ev.success_rate,
                "ci_low": ev.ci_low,
                "ci_high": ev.ci_high,
                "collision_rate": ev.collision_rate,
                "route_left": ev.route_left,
                "route_right": ev.route_right,
                "grasp_target": ev.grasp_target,
                "grasp_wrong": ev.grasp_wrong,
                "grasp_none": ev.grasp_none,
                "recovery_episodes": n_recovery,
                "action_steps": policy.chunk.n_action_steps,
                "train_minutes": summary["train_seconds"] / 60,
                "samples_per_s": summary["train_steps"] * cfg.batch_size / summary["train_seconds"],
                "steps": summary["train_steps"],
                "run": str(cfg.out.relative_to(ROOT)) if cfg.out.is_relative_to(ROOT) else str(cfg.out),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    if arm == "main" and list(cfg.chunk.aux_state[:3]) == TARGET_XYZ:
        for paraphrases in ("train", "heldout"):
            b = binding(policy, meta, 3 if args.smoke else args.binding_scenes, paraphrases, 100_000)
            rows.append(
                {
                    "entry": f"main_binding_{paraphrases}",
                    "paraphrases": paraphrases,
                    "dropped": "none",
                    "episodes": b["scenes"],
                    "bound": b["bound"],
                    "ci_low": b["ci_low"],
                    "ci_high": b["ci_high"],
                    "xy_error_cm": b["xy_error_cm_median"],
                    "chance": b["chance"],
                    "run": rows[0]["run"],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


@dataclass
class Args:
    config: Path = ROOT / "configs" / "grasp_multimodal_cpu.yaml"
    """preset YAML"""
    dataset: Path = DATASET
    """the multimodal dataset (collected when missing)"""
    collect_episodes: int = 300
    """expert episodes collected"""
    recovery_episodes: int = 100
    """appended with dmrl collect --miss-prob 1"""
    image_size: int = 64
    """camera image size"""
    arms: list[Arm] = field(default_factory=lambda: ["main"])
    """arms to train and evaluate"""
    steps: int = 0
    """override the preset's steps (0: keep them)"""
    episodes: int = 100
    """main arm: episodes per paraphrase set"""
    ablation_episodes: int = 50
    """other arms: episodes per paraphrase set"""
    drop_episodes: int = 50
    """main arm: episodes per withheld modality"""
    drop: list[Mode] = field(default_factory=lambda: list(MODES))
    """modalities withheld one at a time at test time (main arm)"""
    action_steps: int = 0
    """evaluate with this Ta (actions per chunk; 0: the checkpoint's)"""
    binding_scenes: int = 200
    """main arm: scenes per paraphrase set (probe)"""
    out: Path = ROOT / "outputs" / "multimodal"
    """run directories go here"""
    smoke: bool = False
    """tiny networks, a few steps, nothing written to benchmarks/results"""


def main() -> None:
    args = parse_args(Args, __doc__, allow_empty=("drop",))
    if args.recovery_episodes < 0:
        sys.exit(f"--recovery-episodes: need 0 or more, got {args.recovery_episodes}")
    if args.binding_scenes < 1:
        sys.exit(f"--binding-scenes: need at least 1, got {args.binding_scenes}")
    if args.action_steps < 0:
        sys.exit(f"--action-steps: need 0 (the checkpoint's Ta) or at least 1, got {args.action_steps}")
    if not args.config.is_file():
        sys.exit(f"--config: no file {args.config}; pass a preset YAML such as configs/grasp_multimodal_cpu.yaml")

    from dmrl.train.run import train

    if args.smoke and args.dataset == DATASET:  # never the real dataset: its size is checked against the flags
        args.dataset = args.out / "smoke_dataset.zarr"
    n, rec, size = (3, 1, 16) if args.smoke else (args.collect_episodes, args.recovery_episodes, args.image_size)
    # --smoke writes nothing to benchmarks/results, so its dataset may hold any number of episodes
    n_recovery = collect_if_missing(args.dataset, n, rec, size, check_size=not args.smoke)
    # The commit is read before training: the tree may change (docs, other work) while an arm trains for an hour.
    info = {
        **machine(),
        "command": "python benchmarks/multimodal.py " + " ".join(sys.argv[1:]),
        "preset": str(args.config),
    }
    rows: list[dict] = []
    for arm in args.arms:
        cfg = arm_config(args, arm)
        summary = finished(cfg, need_eval=False)
        if summary is None:
            cfg.overwrite = True
            summary = train(cfg)
        else:
            print(f"reusing the finished run {cfg.out}")
        rows += evaluate_arm(args, arm, cfg, summary, n_recovery)
    if args.smoke:
        print("--smoke: nothing written to benchmarks/results")
        return
    # Keep the entries of arms not run this time (each row names its run and commit).
    old = RESULTS / "multimodal.json"
    if old.is_file():
        new = {r["entry"] for r in rows}
        kept = [r for r in json.loads(old.read_text()).get("results", []) if r.get("entry") not in new]
        rows = kept + rows
    for r in rows:  # rows kept from an earlier invocation keep its command and commit
        if "success_rate" in r:
            r.setdefault("recovery_episodes", 0)  # rows from before the column: the 300 expert episodes only
        r.setdefault("command", info["command"])
        r.setdefault("git_commit", info["git_commit"])
    write_results("multimodal", rows, info, COLUMNS)


if __name__ == "__main__":
    main()
