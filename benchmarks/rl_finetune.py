"""BC pretraining then online RL fine-tuning (the seed's pipeline) from a deliberately weak dataset: (a) online
Diffusion-QL from scratch, (b) BC only, (c) BC then online Diffusion-QL, on MultiPathGrasp with state observations.

Run: ``python benchmarks/rl_finetune.py [--seeds 0] [--steps 3000]`` (collects outputs/rl_finetune/weak.zarr first:
--demos suboptimal-expert episodes). Every arm uses configs/rl_offline.yaml's actor (256x2 MLP denoiser, x0,
DDIM-10). (b) trains BC for --bc-steps. (a) and (c) train online for --steps updates with one collector and an
evaluator process that scores snapshots every --eval-every updates on --curve-episodes seeds (the learning
curve); (c) starts from (b)'s checkpoint and keeps the demonstrations in its replay; (a) starts from random
weights with an empty replay. With --bc-data successes (default) the online actor's BC term imitates successful
episodes only (the dataset's and its own: self-imitation); --bc-data replay is plain Diffusion-QL's BC on the
replay batch. (d) qc and (e) dsrl start from (b) too and let a critic choose the executed chunks (best-of-N over
the proposal; the frozen policy steered through its initial noise). --env-steps with --env-steps-per-update ends
every online arm at the same env steps *and* updates, whatever each arm's speed. Each arm's final actor (as it
acts) is then evaluated on --episodes seeds 100000.. (--selection: curves and finals on 200000..).
Writes benchmarks/results/{name}.json/.md and docs/{name}.png (success against env steps).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from _common import machine, parse_args, write_results
from _rl import REWARD, REWARD_V1, ROOT, finished, load_run, template, train_one
from dmrl.policies.checkpoint import load_policy
from dmrl.train.evaluate import evaluate
from dmrl.train.metrics import wilson_interval
from dmrl.train.offline import env_kwargs_from_store

# Online arms: name -> (start from the BC checkpoint and keep the demonstrations in the replay, prioritized replay,
# algorithm). bc_rl_uniform is bc_rl with uniform sampling: the PER-vs-uniform comparison (--arms bc_rl
# bc_rl_uniform --name rl_per). qc: Q-chunking from the same BC start, its BC proposal trained on --bc-data, the
# critic choosing every executed chunk (best-of-N) in collectors and evaluation. dsrl: the BC policy frozen, an actor
# choosing its initial noise by a critic (it has no BC term: its bc_data is always replay).
ONLINE = {
    "bc_rl": (True, True, "diffusion-ql"),
    "scratch": (False, True, "diffusion-ql"),
    "bc_rl_uniform": (True, False, "diffusion-ql"),
    "qc": (True, True, "qc"),
    "qc_uniform": (True, False, "qc"),
    "dsrl": (True, True, "dsrl"),
    "dppo": (True, False, "dppo"),
}
Arm = Literal[("bc", *ONLINE)]  # --arms choices
COLORS = {"bc_rl": "C2", "scratch": "C1", "bc_rl_uniform": "C4", "qc": "C3", "qc_uniform": "C5", "dsrl": "C6"}
LABELS = {
    "bc_rl": "(c) BC -> online (PER)",
    "scratch": "(a) online from scratch",
    "bc_rl_uniform": "(c) with uniform replay",
    "qc": "(d) BC -> online QC (PER)",
    "qc_uniform": "(d) QC with uniform replay",
    "dsrl": "(e) BC -> online DSRL (noise steering)",
    "dppo": "(f) BC -> DPPO (PPO over the denoising chain)",
}


def make_weak(path: Path, demos: int) -> Path:
    """``demos`` suboptimal-expert state episodes (seeds 30000..: apart from evaluation and selection seeds)."""
    from dmrl.data import EpisodeStore
    from dmrl.data.collect import CollectConfig, collect

    if path.exists():
        if EpisodeStore.open(path).n_episodes != demos:
            raise ValueError(f"{path}: not {demos} episodes; delete it or pass --demos to match")
        return path
    cfg = CollectConfig(
        out=path, episodes=demos, seed=30_000, obs_modes=("state",), suboptimal=True, workers=2, reward=REWARD
    )
    s = collect(cfg, progress=False).summary()
    print(f"weak dataset: {demos} suboptimal episodes, {s['success_rate']:.0%} of them succeed", flush=True)
    return path


def final_eval(checkpoint: Path, episodes: int, envs: int, first: int = 100_000) -> dict:
    policy, meta = load_policy(checkpoint)
    seeds = list(range(first, first + episodes))
    return evaluate(policy, meta["env_id"], seeds, meta["env_kwargs"], n_envs=envs).summary()


def final_eval_run(run: Path, episodes: int, envs: int, first: int = 100_000) -> dict:
    """The final evaluation of an online run as it acts: the actor, or best-of-N with its critic (qc)."""
    algo, cfg, store = load_run(run)
    seeds = list(range(first, first + episodes))
    policy = algo.evaluation_policy().cpu()
    return evaluate(policy, store.attrs["env_id"], seeds, env_kwargs_from_store(store), n_envs=envs).summary()


def curve(run: Path) -> list[tuple[int, int, float]]:
    """(update, env steps at the snapshot, success) of every periodic evaluation logged by an online run (the
    evaluator's records) or a rollout run (its curve points)."""
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    online = [(r["update"], r["eval_env_steps"], r["eval_success"]) for r in recs if "eval_success" in r]
    return online + [(r["step"], r["env_steps"], r["curve_success"]) for r in recs if "curve_success" in r]


def drawdown(points: list[tuple[int, int, float]], window: int = 3) -> float:
    """Monotonicity of a learning curve: the summed falls of its moving average over ``window`` evaluations
    (0 for a curve that never goes down; the seed's wavy curve against near-monotone PER)."""
    ys = np.array([p[2] for p in points], dtype=float)
    if len(ys) < window + 1:
        return float("nan")
    smooth = np.convolve(ys, np.ones(window) / window, mode="valid")
    return float(np.clip(smooth[:-1] - smooth[1:], 0, None).sum())


def steps_to(points: list[tuple[int, int, float]], threshold: float) -> int | None:
    """Env steps of the first evaluation whose success, averaged with its predecessor (the curve evaluations are
    few episodes each), reaches ``threshold``; None if none does."""
    for i in range(len(points)):
        window = [p[2] for p in points[max(0, i - 1) : i + 1]]
        if np.mean(window) >= threshold and points[i][1] is not None:
            return int(points[i][1])
    return None


@dataclass
class Args:
    config: Path = ROOT / "configs" / "rl_offline.yaml"
    """actor and critic preset"""
    demos: int = 20
    """suboptimal-expert episodes of the weak dataset"""
    seeds: list[int] = field(default_factory=lambda: [0])
    """training seeds"""
    bc_steps: int = 2000
    """BC updates of arm (b) and of (c)'s start"""
    steps: int = 3000
    """online updates of arms (a) and (c)"""
    eta: float = 0.05
    """Diffusion-QL's Q weight online"""
    chain_grad_steps: int | None = None
    """Diffusion-QL: denoising steps the Q gradient flows through (algo.grad_steps_through_chain; default all S)"""
    qc_samples: int = 32
    """QC's best-of-N: chunks sampled per decision"""
    env_steps: int = 0
    """end every online run at this many env steps (0: after --steps updates only)"""
    env_steps_per_update: float = 0.0
    """replay ratio: env steps per update, held by pausing collectors or learner (0: both run free)"""
    offline_share: float = 0.0
    """share of each batch drawn from the demonstrations, kept in their own ring (RLPD: 0.5; 0: prefilled replay)"""
    dsrl_explore: float = 1.0
    """dsrl: std of the collectors' exploration noise added to the actor's initial noise"""
    qc_backup_samples: int = 8
    """QC's in-support backup: proposal samples maxed over at s'"""
    qc_candidate_noise: float = 0.0
    """QC: std of the noise on the executed actions of all but one of the N candidates (algo.candidate_noise)"""
    qc_candidate_margin: float = 0.0
    """QC: Q margin a perturbed candidate needs over the actor's own sample (algo.candidate_margin)"""
    dppo_envs: int = 64
    """dppo: envs per rollout (each runs 25 decisions per rollout)"""
    dppo_lr: float = 1e-4
    """dppo: the diffusion actor's learning rate"""
    dppo_clip: float = 0.01
    """dppo: PPO's clip at the last denoising step (a tenth of it at the first)"""
    dppo_curve_every: int = 4
    """dppo: rollouts between learning-curve points"""
    selection: bool = False
    """curves and final evaluation on the selection seeds (200000..) into {name}_select.json, to choose settings"""
    scratch_eta: float | None = None
    """eta of arm (a) (default: --eta); with eta 0 and no demonstrations nothing would train"""
    bc_data: Literal["replay", "successes"] = "successes"
    """what the online actor's BC term imitates (source.bc_data)"""
    eval_every: int = 250
    """updates between learning-curve points"""
    curve_episodes: int = 20
    """episodes per curve point"""
    episodes: int = 100
    """final evaluation episodes"""
    arms: list[Arm] = field(default_factory=lambda: ["bc", "bc_rl", "scratch"])
    """arms to run"""
    out: Path = ROOT / "outputs" / "rl_finetune"
    """run directories go here"""
    name: str = "rl_finetune"
    """results name (rl_per: --arms bc_rl bc_rl_uniform)"""
    replot: bool = False
    """only redraw docs/{name}.png from the results JSON"""


def main() -> None:
    args = parse_args(Args, __doc__)
    if args.replot:
        path = ROOT / "benchmarks" / "results" / f"{args.name}.json"
        if not path.is_file():
            sys.exit(f"--replot: {path} missing; run without --replot first (or pass the --name of an existing result)")
        saved = json.loads(path.read_text())
        bc = [r["final_success"] for r in saved["results"] if r["arm"] == "bc"]
        plot(saved["meta"]["curves"], bc[0] if bc else None, ROOT / "docs" / f"{args.name}.png")
        return
    import torch

    torch.set_num_threads(1)  # the collector and the evaluator take the other core
    t0 = time.perf_counter()
    scratch_eta = args.eta if args.scratch_eta is None else args.scratch_eta
    first_seed = 200_000 if args.selection else 100_000  # curves and final evaluation
    chain = template(args.config).policy.num_inference_steps
    if args.chain_grad_steps is not None and not 1 <= args.chain_grad_steps <= chain:
        sys.exit(f"--chain-grad-steps: got {args.chain_grad_steps}; allowed 1..{chain} (the preset's DDIM steps)")
    data = make_weak(args.out / ("weak.zarr" if REWARD == REWARD_V1 else f"weak_{REWARD}.zarr"), args.demos)
    results: dict[str, list[dict]] = {a: [] for a in args.arms}
    curves: dict[str, list] = {a: [] for a in args.arms if a != "bc"}
    for seed in args.seeds:
        base = dict(dataset=data, seed=seed, overwrite=True, eval_episodes=0)
        bc_out = args.out / f"bc_seed{seed}"
        # BC is trained for arm (b), or for (c) when no finished BC run of this seed is there to start from.
        from_bc = any(ONLINE[a][0] for a in args.arms if a in ONLINE)
        if "bc" in args.arms or (from_bc and not (bc_out / "checkpoint").exists()):
            bc = {"type": "bc", "lr": 0.0003}  # the preset's actor lr (BC's default: 1e-3)
            train_one(template(args.config, **base, out=bc_out, algo=bc, policy="diffusion", steps=args.bc_steps))
        if "bc" in args.arms:
            ev = final_eval(bc_out / "checkpoint", args.episodes, 2, first_seed)
            results["bc"].append({"eval": ev, "env_steps": 0})
        for arm, (init, prioritized, algo) in ONLINE.items():
            if arm not in args.arms:
                continue
            online = {"type": "online", "n_collectors": 1, "eval_every": args.eval_every,
                      "eval_episodes": args.curve_episodes, "prefill_from_dataset": init and not args.offline_share,
                      "learning_starts": 1000, "bc_data": args.bc_data,
                      "replay": {"capacity": 100_000, "prioritized": prioritized}}  # fmt: skip
            if args.env_steps:
                online["env_steps"] = args.env_steps  # the run ends at this many env steps (or --steps updates)
            if args.env_steps_per_update:
                online["env_steps_per_update"] = args.env_steps_per_update
            if args.offline_share and init:  # the demonstrations in their own ring, a fixed share of every batch
                online["offline_share"] = args.offline_share
            eta = scratch_eta if arm == "scratch" else args.eta
            if algo == "dppo":  # on-policy: fresh rollouts instead of collectors and a replay
                if not args.env_steps:
                    sys.exit(
                        "--arms dppo: pass --env-steps (its runs end at an env-step budget; --steps is per rollout)"
                    )
                online = {"type": "rollout", "n_envs": args.dppo_envs, "decisions": 25, "env_steps": args.env_steps,
                          "curve_every": args.dppo_curve_every, "curve_episodes": args.curve_episodes}  # fmt: skip
                spec = {"type": "dppo", "actor_lr": args.dppo_lr, "clip_ratio": args.dppo_clip,
                        "clip_ratio_first": args.dppo_clip / 10, "minibatch": 4000}  # fmt: skip
                tag = f"e{args.dppo_envs}_lr{args.dppo_lr:g}_c{args.dppo_clip:g}"
            elif algo == "dsrl":
                spec, tag = {"type": "dsrl", "explore_std": args.dsrl_explore}, f"x{args.dsrl_explore:g}"
                online["bc_data"] = "replay"
            elif algo == "qc":
                spec = {"type": "qc", "n_action_samples": args.qc_samples, "backup_samples": args.qc_backup_samples,
                        "candidate_noise": args.qc_candidate_noise,
                        "candidate_margin": args.qc_candidate_margin}  # fmt: skip
                tag = f"n{args.qc_samples}" + (f"b{args.qc_backup_samples}" if args.qc_backup_samples != 8 else "")
                tag += f"s{args.qc_candidate_noise:g}" if args.qc_candidate_noise else ""
                tag += f"m{args.qc_candidate_margin:g}" if args.qc_candidate_margin else ""
            else:
                spec, tag = {"type": "diffusion-ql", "eta": eta}, f"eta{eta:g}"
                if args.chain_grad_steps is not None:  # truncated backprop through the DDIM chain
                    spec["grad_steps_through_chain"] = args.chain_grad_steps
                    tag += f"_k{args.chain_grad_steps}"
            budget = f"_{args.env_steps // 1000}k" if args.env_steps else ""
            budget += f"_r{args.env_steps_per_update:g}" if args.env_steps_per_update and algo != "dppo" else ""
            budget += f"_off{args.offline_share:g}" if args.offline_share and init else ""
            budget += "_sel" if args.selection else ""
            bc_tag = online.get("bc_data", "onpolicy")
            run = args.out / f"{arm}_{tag}_{bc_tag}{budget}_seed{seed}"  # settings in the name: runs coexist
            cfg = template(args.config, **base, out=run, algo=spec, policy="diffusion", steps=args.steps,
                           source=online, init=bc_out / "checkpoint" if init else None,
                           eval_seed=first_seed)  # fmt: skip
            # rl_per.md and rl_finetune.md share the bc_rl runs (online.py writes summary.json after the checkpoint)
            summary = finished(cfg, need_eval=False)
            fresh = summary is None
            if fresh:
                summary = train_one(cfg)
            curves[arm].append(curve(run))
            cached = run / f"final_eval_{args.episodes}.json"
            if fresh or not cached.is_file():
                cached.write_text(json.dumps(final_eval_run(run, args.episodes, 2, first_seed)))
            ev = json.loads(cached.read_text())
            results[arm].append({"eval": ev, "env_steps": summary["env_steps"], "updates": summary["train_steps"]})
            print(f"{arm} seed {seed}: {ev['success_rate']:.2f} after {summary['env_steps']} env steps", flush=True)

    def guided(arm: str) -> bool:  # the critic chooses the chunks (best-of-N) or shapes the actor (eta > 0)
        if arm not in ONLINE:
            return False
        return ONLINE[arm][2] in ("qc", "dsrl", "dppo") or (scratch_eta if arm == "scratch" else args.eta) > 0

    bc_final = float(np.mean([r["eval"]["success_rate"] for r in results["bc"]])) if results.get("bc") else None
    rows = []
    for arm, runs in results.items():
        n = sum(r["eval"]["episodes"] for r in runs)
        wins = int(round(sum(r["eval"]["success_rate"] * r["eval"]["episodes"] for r in runs)))
        lo, hi = wilson_interval(wins, n)
        thr = None if bc_final is None or arm == "bc" else [steps_to(c, bc_final + 0.10) for c in curves[arm]]
        rows.append({
            "arm": arm, "critic_guided": guided(arm), "seeds": len(runs), "episodes": n, "final_success": wins / n,
            "ci_low": lo, "ci_high": hi,
            "per_seed": ", ".join(f"{r['eval']['success_rate']:.2f}" for r in runs),
            "collision_rate": float(np.mean([r["eval"]["collision_rate"] for r in runs])),
            "env_steps": int(np.mean([r["env_steps"] for r in runs])),
            "env_steps_to_threshold": thr,
            "drawdown": None if arm == "bc" else [round(drawdown(c), 3) for c in curves[arm]],
        })  # fmt: skip
    meta = {
        **machine(),
        "command": "python benchmarks/rl_finetune.py " + " ".join(sys.argv[1:]),
        "dataset": f"{args.demos} suboptimal-expert episodes (seeds 30000..)",
        "threshold": None if bc_final is None else f"BC final {bc_final:.2f} + 0.10, mean of 2 consecutive curve evals",
        "bc_steps": args.bc_steps,
        "online_updates": args.steps,
        "reward": REWARD,
        "eta": args.eta,
        "qc_samples": args.qc_samples,
        "chain_grad_steps": args.chain_grad_steps,
        "env_step_budget": args.env_steps or None,
        "scratch_eta": scratch_eta,
        "bc_data": args.bc_data,
        "curve": f"{args.curve_episodes} episodes every {args.eval_every} updates, seeds {first_seed}..",
        "final_eval": f"{args.episodes} episodes, seeds {first_seed}..",
        "env_steps_per_update": args.env_steps_per_update or None,
        "offline_share": args.offline_share or None,
        "qc_backup_samples": args.qc_backup_samples,
        "qc_candidate_noise": args.qc_candidate_noise,
        "qc_candidate_margin": args.qc_candidate_margin,
        "dsrl_explore": args.dsrl_explore,
        "curves": {a: c for a, c in curves.items()},
        "wall_min": round((time.perf_counter() - t0) / 60, 1),
    }
    if args.selection:  # settings are chosen here; docs show evaluation-seed curves only
        write_results(f"{args.name}_select", rows, meta, list(rows[0]))
        return
    write_results(args.name, rows, meta, list(rows[0]))
    plot(curves, bc_final, ROOT / "docs" / f"{args.name}.png")


def plot(curves: dict[str, list], bc_final: float | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for arm, runs in curves.items():
        for i, pts in enumerate(runs):
            xs = [p[1] for p in pts if p[1] is not None]
            ys = [p[2] for p in pts if p[1] is not None]
            ax.plot(xs, ys, marker=".", label=LABELS[arm] if i == 0 else None, color=COLORS[arm])
    if bc_final is not None:
        ax.axhline(bc_final, color="C0", ls="--", label="(b) BC only (final)")
    ax.set_xlabel("env steps")
    ax.set_ylabel("success (curve evaluations)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
