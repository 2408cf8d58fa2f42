"""Meta-World 3.1.1 under MuJoCo 4: the eq_data shim, all 50 tasks with their scripted policies, rendering, seeding."""

from __future__ import annotations

import numpy as np
import pytest

import dmrl  # noqa: F401  (first: it picks the headless GL backend, which MuJoCo reads once, at import)

pytest.importorskip("metaworld", reason="Meta-World not installed (make install puts it in with --no-deps)")

import mujoco  # noqa: E402
from metaworld.sawyer_xyz_env import SawyerMocapBase  # noqa: E402

from dmrl.envs import REGISTRY, make_env, make_expert  # noqa: E402
from dmrl.envs.suites import METAWORLD_ENVS, MT10, metaworld_compat  # noqa: E402
from dmrl.envs.suites.metaworld import MetaWorldEnv, task_names  # noqa: E402
from dmrl.envs.suites.metaworld_language import INSTRUCTIONS, paraphrases  # noqa: E402


def test_shim_only_where_the_weld_row_does_not_fit():
    assert not metaworld_compat.needs_shim(11) and metaworld_compat.needs_shim(12)
    metaworld_compat.remove_shim()
    original = SawyerMocapBase.reset_mocap_welds
    try:
        # An 11-value MuJoCo (3.x): nothing patched.
        assert metaworld_compat.apply_shim(n_eq_data=11) is False
        assert SawyerMocapBase.reset_mocap_welds is original and not metaworld_compat.is_applied()
        if mujoco.mjNEQDATA == 11:
            pytest.skip("this MuJoCo stores 11 eq_data values: Meta-World needs no shim")
        # MuJoCo 4 without the shim fails exactly as the issue reports ...
        with pytest.raises(ValueError, match=r"could not broadcast input array from shape \(11,\) into shape \(12,\)"):
            from metaworld.env_dict import ALL_V3_ENVIRONMENTS

            ALL_V3_ENVIRONMENTS["reach-v3"]()
        # ... and with it the task builds, the weld rows holding Meta-World's 11 values and MuJoCo's 12th untouched.
        assert metaworld_compat.apply_shim() is True and metaworld_compat.apply_shim() is True  # idempotent
        assert SawyerMocapBase.reset_mocap_welds is not original
        env = MetaWorldEnv("reach-v3")
        welds = env.raw.model.eq_type == mujoco.mjtEq.mjEQ_WELD
        np.testing.assert_array_equal(
            env.raw.model.eq_data[welds, :11], metaworld_compat.WELD_ROW[None].repeat(welds.sum(), 0)
        )
        env.close()
    finally:
        metaworld_compat.apply_shim()


def test_registered_names_are_metaworlds_50_tasks():
    assert sorted(METAWORLD_ENVS.values()) == sorted(task_names()) and len(METAWORLD_ENVS) == 50
    assert all(name in REGISTRY for name in METAWORLD_ENVS)
    for task in INSTRUCTIONS:
        train, heldout = paraphrases(task, "train"), paraphrases(task, "heldout")
        assert len(train) >= 2 and heldout and not set(train) & set(heldout)


def test_every_task_builds_and_its_scripted_policy_succeeds():
    """State only, seeds 0, 1, 2 in turn until one succeeds, Meta-World's own 500-step limit (on this machine's
    MuJoCo 4 the policies succeed on 13-20 of 20 seeds per task within 500 steps, docs/suites.md)."""
    failed = []
    for name in METAWORLD_ENVS:
        env = make_env(name, obs_modes=("state",), max_steps=500)
        expert = make_expert(name, env)
        for seed in range(3):
            obs, info = env.reset(seed=seed)
            expert.reset(seed)
            while not info["is_success"]:
                obs, _, terminated, truncated, info = env.step(expert.act(obs))
                if terminated or truncated:
                    break
            if info["is_success"]:
                break
        else:
            failed.append(name)
        env.close()
    assert not failed, f"scripted policy failed 3 seeds on {failed}"


def test_reset_layout_is_a_function_of_the_seed():
    env = MetaWorldEnv("pick-place-v3", obs_modes=("joints", "state"))
    a = env.reset(seed=7)[0]["state"]
    b = env.reset(seed=8)[0]["state"]
    c = env.reset(seed=7)[0]["state"]
    np.testing.assert_array_equal(a, c)
    assert not np.allclose(a[4:7], b[4:7])  # the puck moved
    np.testing.assert_array_equal(env.reset(seed=7)[0]["joints"], a[:4])
    env.close()


def test_two_envs_render_in_one_process():
    envs = [MetaWorldEnv(t, obs_modes=("rgb", "depth")) for t in ("button-press-v3", "drawer-open-v3")]
    frames = []
    for env in envs:
        obs, _ = env.reset(seed=0)
        obs, *_ = env.step(np.zeros(4, dtype=np.float32))
        rgb, depth = obs["rgb"], obs["depth"]
        assert rgb.shape == (3, 84, 84) and rgb.dtype == np.uint8 and depth.shape == (1, 84, 84)
        assert rgb.mean() > 20 and rgb.std() > 10, "black or flat frame"
        assert env.raw.model.vis.quality.offsamples == 0  # no multisampling (shadows, reflections: render.py)
        assert np.isfinite(depth).all() and 0.1 < depth.min() < depth.max()
        frames.append(rgb)
    assert np.abs(frames[0].astype(int) - frames[1].astype(int)).mean() > 1  # two scenes, two images
    for env in envs:
        env.close()


def test_mt10_runs_the_seeds_task_as_its_single_task_env_does_and_the_expert_follows_it():
    """metaworld/mt10: reset seed i runs MT10[i % 10] with the layout and paraphrase of metaworld/<task> at seed i
    (so a policy trained on it is evaluated per task unchanged), ``options={"task": ...}`` names one, and one scripted
    expert, built once, solves each task it is handed (as collect uses it)."""
    mt = make_env("metaworld/mt10", obs_modes=("joints", "instruction", "state"))
    assert mt.unwrapped.tasks == MT10 and set(MT10) <= set(METAWORLD_ENVS.values())
    reach = MetaWorldEnv("reach-v3", obs_modes=("joints", "instruction", "state"))
    assert mt.observation_space == reach.observation_space
    reach.close()
    expert = make_expert("metaworld/mt10", mt)
    failed = []
    for seed in range(20, 30):
        task = MT10[seed % 10]
        obs, info = mt.reset(seed=seed)
        single = MetaWorldEnv(task, obs_modes=("joints", "instruction", "state"))
        ref, _ = single.reset(seed=seed)
        assert mt.unwrapped.task == task and obs["instruction"] == ref["instruction"] == mt.unwrapped.instruction
        np.testing.assert_array_equal(obs["state"], ref["state"])
        single.close()
        expert.reset(seed)
        while not info["is_success"]:
            obs, _, terminated, truncated, info = mt.step(expert.act(obs))
            if terminated or truncated:
                break
        if not info["is_success"]:
            failed.append((seed, task))
    assert len(failed) <= 1, f"the expert failed {failed} (its single-task rate is 90-100% at 200 steps)"
    obs, _ = mt.reset(seed=20, options={"task": "window-close-v3"})
    assert mt.unwrapped.task == "window-close-v3" and "window" in obs["instruction"]
    with pytest.raises(ValueError, match="not one of metaworld/mt10's"):
        mt.reset(seed=0, options={"task": "assembly-v3"})
    mt.close()
