"""Probes of a trained MT10 policy (benchmarks/metaworld_mt10.py): where each held-out instruction lands among the
train tasks for the policy's text encoder and FiLM, and whether its encoder locates the object and the goal in new
layouts (through its auxiliary head). Diagnostics beside the success table, not results of their own."""

from __future__ import annotations

from pathlib import Path

from dmrl.envs.suites import MT10


def language_probe(checkpoint: Path, trained_on: dict[str, list[str]]) -> dict[str, dict]:
    """Where each task's held-out sentence lands for the trained policy: per task and view of its encoder (``text``
    the frozen MiniLM's sentence embedding; ``film`` the FiLM the policy applies to the image features), the task
    whose training sentences (``trained_on``: task -> the instructions of its episodes in the training store) are
    nearest (cosine, the best of a task's sentences) and the margin, own task's similarity minus the best other
    task's (negative: it lands nearer another task)."""
    import torch

    from dmrl.envs.suites.metaworld_language import INSTRUCTIONS
    from dmrl.policies.checkpoint import load_policy

    policy, _ = load_policy(checkpoint)
    names = [t.removesuffix("-v3") for t in MT10]
    train = [(i, s) for i, t in enumerate(MT10) for s in trained_on[t]]
    heldout = [INSTRUCTIONS[t][1][0] for t in names]
    views_train = policy.encoder.instruction_views([s for _, s in train])
    views_heldout = policy.encoder.instruction_views(heldout)
    owner = torch.tensor([i for i, _ in train])
    probe: dict[str, dict] = {t: {"heldout_sentence": h} for t, h in zip(MT10, heldout, strict=True)}
    for view in ("text", "film"):
        if view not in views_train:
            continue
        a = torch.nn.functional.normalize(views_heldout[view], dim=-1)
        b = torch.nn.functional.normalize(views_train[view], dim=-1)
        sim = a @ b.T  # (10 held-out, n training sentences)
        per_task = torch.stack([sim[:, owner == i].max(1).values for i in range(len(MT10))], 1)  # (10, 10)
        for i, task in enumerate(MT10):
            others = torch.cat([per_task[i, :i], per_task[i, i + 1 :]])
            probe[task][f"nearest_{view}"] = MT10[int(per_task[i].argmax())]
            probe[task][f"margin_{view}"] = round(float(per_task[i, i] - others.max()), 3)
    return probe


def position_probe(checkpoint: Path, seeds: range) -> dict[str, dict]:
    """Whether the trained encoder sees where things are in new layouts: per task, over the first frames of
    ``seeds``, the auxiliary head's RMS error (cm) for the first object's xyz (state 4-6) and the goal's (36-38)
    beside the spread (std, cm) of the true positions. An error near the spread is the head predicting the mean: the
    policy does not locate them. {} for a policy without that auxiliary head."""
    import numpy as np
    import torch

    from dmrl.envs.suites.metaworld import MetaWorldEnv
    from dmrl.policies.checkpoint import load_policy
    from dmrl.policies.observations import roll_history, step_tensors

    policy, _ = load_policy(checkpoint)
    if policy.aux_head is None or tuple(policy.chunk.aux_state) != (4, 5, 6, 36, 37, 38):
        return {}
    keys = list(policy.chunk.obs_keys)
    probe = {}
    for task in MT10:
        env = MetaWorldEnv(task, obs_modes=(*keys, "state"))
        predicted, true = [], []
        for seed in seeds:
            obs, _ = env.reset(seed=seed)
            step, _ = step_tensors(obs, keys, torch.device("cpu"))
            history = roll_history(None, step, torch.ones(1, dtype=torch.bool), policy.chunk.n_obs_steps)
            with torch.no_grad():
                pooled = policy.encode(history)
                normalised = policy.aux_head(pooled)[0]
            predicted.append(((normalised - policy.aux_offset) / policy.aux_scale).numpy())
            true.append(obs["state"][[4, 5, 6, 36, 37, 38]])
        env.close()
        predicted, true = np.asarray(predicted), np.asarray(true)
        error = 100 * np.sqrt(((predicted - true) ** 2).mean(0))
        spread = 100 * true.std(0)
        probe[task] = {
            "object_error_cm": round(float(np.linalg.norm(error[:3])), 1),
            "object_spread_cm": round(float(np.linalg.norm(spread[:3])), 1),
            "goal_error_cm": round(float(np.linalg.norm(error[3:])), 1),
            "goal_spread_cm": round(float(np.linalg.norm(spread[3:])), 1),
        }
    return probe
