"""Contract tests of the MultiPath environments: spaces, check_env, determinism, options, geometry."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from dmrl.envs import ENV_IDS, arm, make_env
from dmrl.envs.geometry import route_distance
from dmrl.envs.language import TEMPLATES
from dmrl.envs.render import DEPTH_MAX


@pytest.mark.parametrize("env_id", sorted(ENV_IDS))
def test_check_env_all_modalities(env_id):
    env = gym.make(env_id)
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=3)
    assert obs["rgb"].shape == (3, 64, 64) and obs["rgb"].dtype == np.uint8
    assert obs["depth"].shape == (1, 64, 64) and obs["depth"].dtype == np.float32
    assert obs["depth"].min() > 0.2 and obs["depth"].max() <= DEPTH_MAX
    assert obs["joints"].shape == (6,) and obs["force"].shape == (4,)
    assert obs["state"].shape == (31,) and isinstance(obs["instruction"], str)
    assert set(info) >= {"is_success", "collision", "route"}
    assert obs["rgb"].std() > 10, "rendered image is blank"


def test_obs_modes_subset_and_cameras():
    env = make_env(
        "dmrl/MultiPathReach-v0",
        obs_modes=("joints", "rgb"),
        cameras=("front", "top"),
        image_size=32,
        n_objects=2,
    )
    obs, _ = env.reset(seed=0)
    assert set(obs) == {"joints", "rgb"}
    assert obs["rgb"].shape == (6, 32, 32)
    assert not np.array_equal(obs["rgb"][:3], obs["rgb"][3:]), "each camera must render its own view"
    assert env.observation_space["rgb"].shape == (6, 32, 32)


def test_same_seed_same_observations():
    a, b = (make_env("dmrl/MultiPathGrasp-v0") for _ in range(2))
    oa, _ = a.reset(seed=11)
    ob, _ = b.reset(seed=11)
    rng = np.random.default_rng(0)
    for _ in range(5):
        act = rng.uniform(-1, 1, 6).astype(np.float32)
        for k in oa:
            assert np.array_equal(oa[k], ob[k]) if k != "instruction" else oa[k] == ob[k]
        oa, ra, *_ = a.step(act)
        ob, rb, *_ = b.step(act)
        assert ra == rb
    oc, _ = a.reset(seed=12)
    assert not np.array_equal(oc["state"], make_env("dmrl/MultiPathGrasp-v0").reset(seed=11)[0]["state"])


def test_reset_options_and_language_errors():
    env = make_env("dmrl/MultiPathGrasp-v0", obs_modes=("instruction", "state"))
    obs, info = env.reset(seed=0, options={"target": "green"})
    assert info["target"] == "green" and "green" in obs["instruction"]
    obs, info = env.reset(seed=0, options={"instruction": "grab the blue mug, set it on the mat"})
    assert info["target"] == "blue" and obs["instruction"] == "grab the blue mug, set it on the mat"
    with pytest.raises(ValueError, match="names no known object"):
        env.reset(seed=0, options={"instruction": "pick up the purple cup"})
    with pytest.raises(ValueError, match="disagree"):
        env.reset(seed=0, options={"target": "red", "instruction": "move the blue mug to the pad"})
    with pytest.raises(ValueError, match="unknown keys"):
        env.reset(seed=0, options={"colour": "red"})
    two = make_env("dmrl/MultiPathGrasp-v0", n_objects=2, obs_modes=("state",))
    with pytest.raises(ValueError, match="cups in the scene"):
        two.reset(seed=0, options={"target": "blue"})


def test_paraphrase_splits_are_disjoint():
    seen = {}
    for split in ("train", "heldout"):
        env = make_env("dmrl/MultiPathGrasp-v0", obs_modes=("instruction",), paraphrases=split)
        seen[split] = {env.reset(seed=s, options={"target": "red"})[0]["instruction"] for s in range(40)}
    assert len(seen["train"]) >= 4 and len(seen["heldout"]) >= 2
    assert not seen["train"] & seen["heldout"]


def test_heldout_paraphrases_share_only_function_words_with_train():
    # The held-out split tests the language model's semantics: none of its verbs or nouns may occur in train.
    def words(templates):
        return {w for t in templates for w in re.findall(r"[a-z]+", t.format(c=""))}

    for task, split in TEMPLATES.items():
        shared = words(split["train"]) & words(split["heldout"])
        assert shared <= {"the", "to", "onto"}, (task, shared)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"task": "push"}, "task"),
        ({"image_size": 512}, "image_size"),
        ({"obs_modes": ("lidar",)}, "obs_modes"),
        ({"cameras": ("wrist",)}, "cameras"),
        ({"n_objects": 5}, "n_objects"),
        ({"paraphrases": "x"}, "paraphrases"),
    ],
)
def test_bad_config_is_one_line_error(kwargs, match):
    from dmrl.envs import MultiPathConfig

    with pytest.raises(ValueError, match=match) as e:
        MultiPathConfig(**kwargs)
    assert "\n" not in str(e.value)


def test_unknown_env_id():
    with pytest.raises(ValueError, match="known environments"):
        make_env("dmrl/MultiPathPush-v0")


def test_ik_round_trip_over_workspace():
    ws = arm.Workspace()
    rng = np.random.default_rng(0)
    for _ in range(200):
        tip = rng.uniform(ws.low, ws.high)
        q = arm.inverse_kinematics(tip, yaw=rng.uniform(-1, 1), pitch=rng.uniform(-0.4, 0.4))
        np.testing.assert_allclose(arm.forward_kinematics(q), tip, atol=1e-6)


def test_arm_tracks_commands_and_obstacle_collision_terminates():
    env = make_env("dmrl/MultiPathGrasp-v0", obs_modes=("state",))
    env.reset(seed=0)
    # Fly straight ahead at carry height: the obstacle sits at x = 0 between cups and pad.
    for _ in range(40):
        _, reward, terminated, truncated, info = env.step(np.array([0, 1, 0, 0, 0, -1], dtype=np.float32))
        tip = env.data.site_xpos[env._tip_site]
        if not info["collision"]:
            assert np.linalg.norm(tip - env.cmd_pos) < 0.01, "IK + servo should track within 1 cm"
        if terminated:
            break
    assert terminated and info["collision"] and not info["is_success"]
    assert reward < 0


def test_route_distance_goes_around_obstacle():
    oy = 0.5
    straight = route_distance(np.array([0, 0.3, 0.2]), np.array([0, 0.7, 0.2]), oy)
    assert straight > 0.4 + 0.1, "a path through the obstacle must not count as straight-line distance"
    side = route_distance(np.array([0.3, 0.3, 0.2]), np.array([0.3, 0.7, 0.2]), oy)
    assert side == pytest.approx(0.4)
    left = route_distance(np.array([-0.05, 0.3, 0.2]), np.array([0, 0.7, 0.2]), oy)
    right = route_distance(np.array([0.05, 0.3, 0.2]), np.array([0, 0.7, 0.2]), oy)
    assert left == pytest.approx(right)
