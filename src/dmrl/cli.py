"""Command line: ``dmrl collect | info | demo`` (tyro subcommands over typed dataclass configs)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro


@dataclass
class InfoConfig:
    """``dmrl info``: print a summary of an episode store."""

    path: tyro.conf.Positional[Path]
    """The episode store to describe."""


@dataclass
class DemoConfig:
    """``dmrl demo``: collect a small expert dataset and draw the scene and the expert routes."""

    out: Path = Path("outputs/demo")
    """Directory for the dataset (expert.zarr) and the pictures (scene.png, routes.png)."""
    episodes: int = 40
    """Expert episodes to collect on each task."""
    workers: int = 2
    """Collector processes."""
    overwrite: bool = True
    """Replace the demo's previous dataset (only inside --out)."""


def _run_info(cfg: InfoConfig) -> None:
    from dmrl.data import EpisodeStore

    store = EpisodeStore.open(cfg.path)
    attrs = {k: store.attrs.get(k) for k in ("env_id", "obs_modes", "obs_spec", "action_meaning")}
    print(json.dumps({"path": str(cfg.path), **attrs, **store.summary()}, indent=2, default=str))


def _run_collect(cfg) -> None:
    from dmrl.envs.collect import collect

    store = collect(cfg)
    print(json.dumps(store.summary(), default=str))


def _run_demo(cfg: DemoConfig) -> None:
    import numpy as np

    from dmrl.envs import make_env
    from dmrl.envs.collect import CollectConfig, collect
    from dmrl.envs.plotting import save_path_plot, save_scene_figure

    frames = {}
    for env_id, task in (("dmrl/MultiPathGrasp-v0", "grasp"), ("dmrl/MultiPathReach-v0", "reach")):
        env = make_env(env_id, obs_modes=("rgb", "depth"), image_size=128, cameras=("front", "top"))
        obs, _ = env.reset(seed=0)
        frames[f"{task}: front rgb"] = np.moveaxis(obs["rgb"][:3], 0, -1)
        frames[f"{task}: top rgb"] = np.moveaxis(obs["rgb"][3:], 0, -1)
        depth = obs["depth"][0]
        frames[f"{task}: front depth (m)"] = (
            np.stack([1 - (depth - depth.min()) / np.ptp(depth)] * 3, -1) * 255
        ).astype(np.uint8)
        env.close()
    print(f"scene: {save_scene_figure(frames, cfg.out / 'scene.png')}")
    for env_id, task in (("dmrl/MultiPathGrasp-v0", "grasp"), ("dmrl/MultiPathReach-v0", "reach")):
        ccfg = CollectConfig(
            out=cfg.out / f"expert_{task}.zarr",
            env=env_id,
            episodes=cfg.episodes,
            obs_modes=("state", "joints", "force", "instruction"),
            workers=cfg.workers,
            overwrite=cfg.overwrite,
        )
        store = collect(ccfg)
        s = store.summary()
        paths = [store.episode(i).obs["state"][:, :2] for i in range(store.n_episodes)]
        plot = save_path_plot(
            paths,
            store.routes(),
            task,
            cfg.out / f"routes_{task}.png",
            title=f"{env_id}: {store.n_episodes} expert episodes",
        )
        print(f"{task}: {json.dumps(s, default=str)}\n  routes: {plot}")


def _parse(command, argv: list[str] | None):
    """tyro parsing, with its boxed multi-line errors turned into the one line every dmrl error is."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            return tyro.cli(command, args=argv, prog="dmrl")
    except SystemExit as e:
        if e.code in (0, None):
            raise
        print(f"dmrl: error: {_first_message(buf.getvalue())}", file=sys.stderr)
        return None


def _first_message(text: str) -> str:
    """The first paragraph of a tyro error box as one line (box drawing and colour codes removed)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    words: list[str] = []
    for line in text.splitlines():
        line = line.strip(" │|╭╮╰╯─-")
        titles = ("Value error", "Parsing error", "Unrecognized options", "Required options")
        if not line or line in titles or line.startswith(("usage:", "Usage:")):
            if words:
                break
            continue
        if set(line) <= set("─━-"):
            if words:
                break
            continue
        words.append(line)
    msg = " ".join(words) or "invalid arguments"
    return f"{msg} (see dmrl --help)"


def main(argv: list[str] | None = None) -> int:
    from dmrl.envs.collect import CollectConfig

    command = (
        Annotated[CollectConfig, tyro.conf.subcommand("collect")]
        | Annotated[InfoConfig, tyro.conf.subcommand("info")]
        | Annotated[DemoConfig, tyro.conf.subcommand("demo")]
    )
    try:
        cfg = _parse(command, argv)
        if cfg is None:
            return 2
        runner = {CollectConfig: _run_collect, InfoConfig: _run_info, DemoConfig: _run_demo}[type(cfg)]
        runner(cfg)
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as e:
        # Bad input is reported in one line; nothing written before has been touched.
        print(f"dmrl: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dmrl: interrupted; every episode completed so far is committed", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
