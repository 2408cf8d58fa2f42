"""The MultiPath reward (issue 27 §1): a continuous route distance, exactly potential-based shaping under which a
collision never pays, the sparse option, and reward options that change nothing but the reward.

The ``shaped_v1`` tests pin the two bugs of the old reward (kept to reproduce old results), as the issue found them.
"""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest

from dmrl.envs import make_env, scene
from dmrl.envs.experts import LIFT, ExpertConfig, ScriptedExpert
from dmrl.envs.geometry import DEPTH_COST, INSIDE_COST, footprint, route_distance, route_distance_v1
from dmrl.envs.multipath import MultiPathConfig

GAMMA = 0.99  # CriticConfig.gamma, checked below
TA = 8  # executed actions per chunk
SEEDS = range(20)
GOALS = {"grasp": (0.5, np.array([0.0, 0.66, 0.04])), "reach": (0.4, np.array([0.0, 0.64, 0.09]))}


def test_gamma_matches_the_critic_default():
    from dmrl.algos.critic import CriticConfig

    assert MultiPathConfig().gamma == CriticConfig().gamma == GAMMA


# --------------------------------------------------------------------------- route distance
def _max_jump(distance, oy, goal, step=1e-3):
    """Largest change of ``distance`` between neighbouring points of dense lines along y and x over the table."""
    ys, xs = np.arange(0.15, 0.8, step), np.arange(-0.32, 0.32, step)
    worst = 0.0
    for x in np.linspace(-0.3, 0.3, 25):
        d = [distance(np.array([x, y, 0.1]), goal, oy) for y in ys]
        worst = max(worst, float(np.abs(np.diff(d)).max()))
    for y in np.linspace(oy - 0.2, oy + 0.2, 21):
        d = [distance(np.array([x, y, 0.1]), goal, oy) for x in xs]
        worst = max(worst, float(np.abs(np.diff(d)).max()))
    return worst


@pytest.mark.parametrize("task", ["grasp", "reach"])
def test_route_distance_is_continuous_through_the_band(task):
    oy, goal = GOALS[task]
    # Lipschitz: at most INSIDE_COST + DEPTH_COST per metre (inside the footprint), 1 outside.
    assert _max_jump(route_distance, oy, goal) <= (INSIDE_COST + DEPTH_COST) * 1e-3 * (1 + 1e-9)
    # Finding 1 (old distance): a jump of up to 0.28 m at the band's edge, 0.07-0.12 m where its crossing test flips.
    assert _max_jump(route_distance_v1, oy, goal) > 0.2  # grasp 0.278, reach 0.236


def test_route_distance_v1_cuts_through_the_band_and_the_fix_does_not():
    oy, goal = GOALS["grasp"]
    before, inside = np.array([0.0, 0.389, 0.04]), np.array([0.0, 0.391, 0.04])
    old = route_distance_v1(before, goal, oy), route_distance_v1(inside, goal, oy)
    assert old[0] == pytest.approx(0.5476, abs=1e-4) and old[1] == pytest.approx(0.269, abs=1e-4)  # 5 x 0.28 reward
    new = route_distance(before, goal, oy), route_distance(inside, goal, oy)
    assert new[0] == pytest.approx(old[0]) and new[1] >= new[0]


def test_route_distance_never_shrinks_moving_into_the_obstacle():
    """From points of the inflated footprint (outside the block itself), a 1 mm step toward the nearest point of the
    obstacle block never shortens the route: the potential cannot grow by heading into the obstacle."""
    rng = np.random.default_rng(0)
    ox, oyh = scene.OBSTACLE_HALF[:2]
    for task in ("grasp", "reach"):
        oy, goal = GOALS[task]
        hx, hy = footprint()
        checked = 0
        for p in rng.uniform([-hx, oy - hy], [hx, oy + hy], size=(3000, 2)):
            nearest = np.clip(p, [-ox, oy - oyh], [ox, oy + oyh])
            gap = np.linalg.norm(nearest - p)
            if gap < 2e-3:
                continue
            q = p + 1e-3 * (nearest - p) / gap
            d0 = route_distance(np.array([*p, 0.1]), goal, oy)
            d1 = route_distance(np.array([*q, 0.1]), goal, oy)
            assert d1 >= d0 - 1e-12, f"{task}: {p} -> {q} shortens the route {d0:.5f} -> {d1:.5f}"
            checked += 1
        assert checked > 2000


def _crosses_open_rect(p, g, hx, hy):
    """Separating-axis test (independent of the module's clip): does segment p-g meet the open rectangle?"""
    if not (min(p[0], g[0]) < hx and max(p[0], g[0]) > -hx and min(p[1], g[1]) < hy and max(p[1], g[1]) > -hy):
        return False
    n = np.array([g[1] - p[1], p[0] - g[0]])
    proj = [n @ c for c in ((hx, hy), (-hx, hy), (-hx, -hy), (hx, -hy))]
    return min(proj) < n @ np.asarray(p) < max(proj)


def test_route_distance_is_the_visibility_graph_shortest_path():
    hx, hy = footprint()
    rng = np.random.default_rng(1)
    checked = 0
    for p, g in rng.uniform(-0.5, 0.5, size=(1500, 2, 2)):
        if any(abs(v[0]) < hx and abs(v[1]) < hy for v in (p, g)):
            continue
        nodes = [p, g, *map(np.array, ((hx, hy), (-hx, hy), (-hx, -hy), (hx, -hy)))]
        dist, todo = [0.0] + [np.inf] * 5, set(range(6))
        while todo:  # Dijkstra over {p, g, corners}
            i = min(todo, key=dist.__getitem__)
            todo.remove(i)
            for j in todo:
                if not _crosses_open_rect(nodes[i], nodes[j], hx, hy):
                    dist[j] = min(dist[j], dist[i] + float(np.linalg.norm(nodes[j] - nodes[i])))
        got = route_distance(np.array([p[0], p[1], 0.0]), np.array([g[0], g[1], 0.0]), 0.0)
        assert got == pytest.approx(dist[1], abs=1e-9)
        checked += 1
    assert checked > 500


# --------------------------------------------------------------------------- rollouts
def _straight(env, expert):
    """Scripted "drive straight into the obstacle": the expert until the cup is lifted (grasp), then full speed in
    a straight line at the goal (pad or cup), which the obstacle blocks."""
    s = env.task_state()
    if s.task == "grasp" and expert._k <= LIFT:
        return expert.act()
    goal = s.pad if s.task == "grasp" else s.cups[s.target][:2]
    a = np.zeros(6, np.float32)
    d = goal - s.tip[:2]
    a[:2] = d / np.abs(d).max()
    a[5] = 1.0 if s.task == "grasp" else -1.0
    return a


@functools.cache
def _rollout(task: str, reward: str, kind: str, seed: int):
    """(state obs (T+1, S), actions (T, 6), rewards (T,), success, collision) of one episode."""
    env = make_env(f"dmrl/MultiPath{task.title()}-v0", obs_modes=("state",), reward=reward).unwrapped
    obs, _ = env.reset(seed=seed)
    expert = ScriptedExpert(env, ExpertConfig(suboptimal=kind == "suboptimal"))
    expert.reset(seed)
    states, actions, rewards = [obs["state"]], [], []
    while True:
        a = _straight(env, expert) if kind == "straight" else expert.act()
        obs, r, terminated, truncated, info = env.step(a)
        states.append(obs["state"])
        actions.append(a)
        rewards.append(r)
        if terminated or truncated:
            return np.array(states), np.array(actions), np.array(rewards), info["is_success"], info["collision"]


def _returns(task, reward, discounted):
    out = {"success": [], "collision": [], "other": []}
    for kind in ("expert", "suboptimal", "straight"):
        for seed in SEEDS:
            *_, r, success, collision = _rollout(task, reward, kind, seed)
            ret = float(r @ GAMMA ** np.arange(len(r))) if discounted else float(r.sum())
            out["success" if success else "collision" if collision else "other"].append(ret)
    return out


@pytest.mark.parametrize("reward", ["shaped", "sparse"])
@pytest.mark.parametrize("task", ["grasp", "reach"])
def test_a_collision_never_pays(task, reward):
    """Over expert, suboptimal-expert and straight-into-the-obstacle episodes, every colliding episode's return is
    below every successful one's, discounted with the critic's gamma and undiscounted."""
    for discounted in (True, False):
        ret = _returns(task, reward, discounted)
        assert len(ret["collision"]) >= len(SEEDS) and len(ret["success"]) >= len(SEEDS)
        assert max(ret["collision"]) < min(ret["success"]), (discounted, max(ret["collision"]), min(ret["success"]))
        if reward == "shaped" and discounted:
            # and below what a non-colliding failure gets: a collision is the worst outcome for the critic too
            assert not ret["other"] or max(ret["collision"]) < min(ret["other"])


def test_shaped_v1_pays_for_collisions():
    """Finding 2 (old reward): carrying the cup straight into the obstacle has a positive return."""
    ret = _returns("grasp", "shaped_v1", discounted=False)
    assert sum(r > 0 for r in ret["collision"]) >= 0.9 * len(ret["collision"])


@pytest.mark.parametrize("task", ["grasp", "reach"])
def test_reward_options_change_only_the_reward(task):
    """Observations, actions, success and collision of expert episodes are the same under every reward option."""
    for seed in SEEDS:
        ref = _rollout(task, "shaped", "expert", seed)
        for reward in ("sparse", "shaped_v1"):
            other = _rollout(task, reward, "expert", seed)
            np.testing.assert_array_equal(other[0], ref[0])
            np.testing.assert_array_equal(other[1], ref[1])
            assert other[3:] == ref[3:]
        sparse = _rollout(task, "sparse", "expert", seed)[2]
        assert set(np.unique(sparse)) <= {0.0, 1.0} and sparse[-1] == float(ref[3])


def test_unknown_reward_is_a_one_line_error():
    with pytest.raises(ValueError, match="reward: got 'dense'; allowed: shaped, sparse, shaped_v1"):
        MultiPathConfig(reward="dense")


# --------------------------------------------------------------------------- chunks at branch states
def _chunk_return(env, actions):
    """Discounted reward of executing ``actions`` open loop from the env's state (on a copy), and if it collided."""
    env = copy.deepcopy(env)
    total, collided = 0.0, False
    for k, a in enumerate(actions):
        _, r, terminated, truncated, info = env.step(a)
        total += GAMMA**k * r
        collided = info["collision"]
        if terminated or truncated:
            break
    return total, collided


def _into_obstacle_chunks(s):
    """Constant-action chunks (Ta, 6) at the obstacle block from tip state ``s``: straight, and angled in x."""
    chunks = []
    suction = 1.0 if s.attached >= 0 else -1.0
    for dx in (-0.6, -0.3, 0.0, 0.3, 0.6):
        for speed in (1.0, 0.7):
            a = np.array([dx - s.tip[0] / 0.1, np.sign(s.obstacle_y - s.tip[1]), 0, 0, 0, suction], np.float32)
            a[:2] = np.clip(a[:2], -1, 1) * speed
            chunks.append(np.repeat(a[None], TA, 0))
    return chunks


def _branch_comparisons(task, reward, seeds=range(6)):
    """(expert chunk return, best colliding chunk return) at expert states from which some chunk hits the obstacle."""
    out = []
    for seed in seeds:
        env = make_env(f"dmrl/MultiPath{task.title()}-v0", obs_modes=("state",), reward=reward).unwrapped
        env.reset(seed=seed)
        expert = ScriptedExpert(env)
        expert.reset(seed)
        for t in range(env.cfg.max_steps):
            s = env.task_state()
            near = abs(s.tip[1] - s.obstacle_y) < 0.3 and abs(s.tip[0]) < 0.25
            if t % 2 == 0 and near:
                expert_ret, _ = _chunk_return(env, _expert_actions(env, expert))
                hits = [r for r, c in (_chunk_return(env, ch) for ch in _into_obstacle_chunks(s)) if c]
                if hits:
                    out.append((expert_ret, max(hits)))
            _, _, terminated, truncated, _ = env.step(expert.act())
            if terminated or truncated:
                break
    return out


def _expert_actions(env, expert):
    """The expert's next chunk from the env's state (closed loop on a copy, executed open loop by the caller)."""
    env, expert = copy.deepcopy((env, expert))
    actions = []
    for _ in range(TA):
        a = expert.act()
        actions.append(a)
        *_, terminated, truncated, _ = env.step(a)
        if terminated or truncated:
            break
    return actions


@pytest.mark.parametrize("task", ["grasp", "reach"])
def test_no_chunk_into_the_obstacle_earns_more_than_the_expert_chunk(task):
    rows = _branch_comparisons(task, "shaped")
    assert len(rows) >= 10
    worst = max(hit - exp for exp, hit in rows)
    assert worst < 0, f"a chunk into the obstacle out-earns the expert's by {worst:.3f}"
