"""``dmrl data import | export``: LeRobotDataset v3 and robomimic HDF5 into the episode store, and the store out
as LeRobotDataset v3."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Union

import tyro

from dmrl.data.importers.mapping import KeyMap, load_mapping, merge_flags

log = logging.getLogger("dmrl.data.importers")
FORMATS = ("auto", "lerobot", "hdf5")


@dataclass
class ImportConfig:
    """``dmrl data import SOURCE --out STORE``: a LeRobotDataset v3 directory or a robomimic HDF5 file into a dmrl
    episode store (streamed: one episode in memory)."""

    source: tyro.conf.Positional[Path]
    """A LeRobotDataset v3 directory (with meta/info.json) or a robomimic-style .hdf5 file."""
    out: Path
    """The episode store to write (a directory, conventionally *.zarr)."""
    format: str = "auto"
    """lerobot, hdf5, or auto (a directory with meta/info.json is lerobot; a .hdf5/.h5 file is hdf5)."""
    mapping: Path | None = None
    """A YAML with any of the keys rgb, joints, force, state, action, reward, done (flags override it)."""
    rgb: tuple[str, ...] = ()
    """Camera keys stacked as rgb channels, in order (default: every camera; none: no rgb)."""
    joints: tuple[str, ...] = ()
    """Vector keys concatenated into joints (default: observation.state, or robomimic's robot0_joint_pos)."""
    force: tuple[str, ...] = ()
    """Vector keys concatenated into force (default: none)."""
    state: tuple[str, ...] = ()
    """Vector keys concatenated into state, privileged (default: none)."""
    action: str = ""
    """The action key (default: action, or robomimic's actions)."""
    reward: str = ""
    """The reward key (default: next.reward / rewards where present; none: zeros)."""
    done: str = ""
    """The done-flag key; an episode's last value is stored as terminated (default: next.done / dones; none:
    every episode truncated)."""
    instruction: str | None = None
    """One instruction for every episode, instead of the LeRobot task string (robomimic has none)."""
    env_id: str = ""
    """The store's env_id; name a registered env (e.g. dmrl/MultiPathReach-v0) to evaluate with dmrl eval (default:
    lerobot:<dir name> or robomimic:<env_name>)."""
    image_size: int | None = None
    """Resize every LeRobot camera to image_size x image_size (aspect not kept); default: as recorded."""
    episodes: int | None = None
    """Import only the first N episodes (default: all)."""
    overwrite: bool = False
    """Replace an existing store at --out."""
    resume: bool = False
    """Continue an interrupted import into --out after its committed episodes (same source and mapping)."""

    def __post_init__(self) -> None:
        self.source, self.out = Path(self.source), Path(self.out)
        if self.format not in FORMATS:
            raise ValueError(f"--format: got {self.format!r}; allowed: {', '.join(FORMATS)}")
        if self.image_size is not None and not 8 <= self.image_size <= 1024:
            raise ValueError(f"--image-size: got {self.image_size}; allowed 8 .. 1024")
        if self.episodes is not None and self.episodes < 1:
            raise ValueError(f"--episodes: got {self.episodes}; must be >= 1")
        if self.overwrite and self.resume:
            raise ValueError("--overwrite and --resume exclude each other; pick one")

    def keymap(self) -> KeyMap:
        """The mapping: the YAML's (if any), overridden by the flags given."""
        flags = KeyMap(**{f.name: getattr(self, f.name) for f in fields(KeyMap)})
        return merge_flags(load_mapping(self.mapping), flags) if self.mapping is not None else flags

    def resolved_format(self) -> str:
        if self.format != "auto":
            return self.format
        if (self.source / "meta" / "info.json").is_file():
            return "lerobot"
        if self.source.is_file() and self.source.suffix in (".hdf5", ".h5"):
            return "hdf5"
        if not self.source.exists():
            raise FileNotFoundError(f"SOURCE {self.source}: no such file or directory")
        raise ValueError(
            f"SOURCE {self.source}: neither a LeRobot dataset (no meta/info.json) nor a .hdf5/.h5 file; pass --format"
        )


@dataclass
class ExportConfig:
    """``dmrl data export STORE --out DIR``: a dmrl episode store as a LeRobotDataset v3 directory."""

    store: tyro.conf.Positional[Path]
    """The episode store to export."""
    out: Path
    """The LeRobotDataset directory to write (built in OUT.partial, renamed when complete)."""
    fps: float | None = None
    """Frames per second (default: the fps recorded at import; a collected store needs it given)."""
    vcodec: str = "libsvtav1"
    """Video codec (lerobot's default libsvtav1; libx264 and others that FFmpeg has)."""
    crf: int = 30
    """Constant rate factor: lower is better quality and bigger files (0 is lossless for libx264)."""
    gop: int = 2
    """Keyframe interval in frames (lerobot's default 2: fast random access)."""
    pix_fmt: str = "yuv420p"
    """Pixel format of the video (yuv444p keeps full colour resolution where the codec allows)."""
    robot_type: str | None = None
    """info.json robot_type (default: the one recorded at import)."""
    overwrite: bool = False
    """Replace an existing LeRobot dataset at --out."""

    def __post_init__(self) -> None:
        self.store, self.out = Path(self.store), Path(self.out)
        if self.fps is not None and not self.fps > 0:
            raise ValueError(f"--fps: got {self.fps}; must be > 0")
        if not 0 <= self.crf <= 63:
            raise ValueError(f"--crf: got {self.crf}; allowed 0 .. 63")
        if self.gop < 1:
            raise ValueError(f"--gop: got {self.gop}; must be >= 1")


@dataclass
class DataCommand:
    """``dmrl data import | export``: bring LeRobot / robomimic datasets in, send stores out as LeRobot v3."""

    cmd: tyro.conf.OmitSubcommandPrefixes[
        Union[  # noqa: UP007 - tyro reads subcommands from a typing.Union
            Annotated[ImportConfig, tyro.conf.subcommand("import")],
            Annotated[ExportConfig, tyro.conf.subcommand("export")],
        ]
    ]


def run_import(cfg: ImportConfig, progress: bool = True) -> dict:
    """Import; returns the store's summary (also printed as JSON by the CLI)."""
    from dmrl.data.importers.sink import write_store

    fmt = cfg.resolved_format()
    if fmt == "lerobot":
        from dmrl.data.importers.lerobot import LeRobotSource

        src = LeRobotSource(cfg.source, cfg.keymap(), image_size=cfg.image_size, instruction=cfg.instruction)
    else:
        from dmrl.data.importers.hdf5 import Hdf5Source

        src = Hdf5Source(cfg.source, cfg.keymap(), image_size=cfg.image_size, instruction=cfg.instruction)
    try:
        spec = src.spec(cfg.env_id or None, cfg.episodes)
        store = write_store(
            cfg.out,
            spec,
            lambda skip: src.episodes(skip, cfg.episodes),
            overwrite=cfg.overwrite,
            resume=cfg.resume,
            progress=progress,
        )
    finally:
        src.close()
    store.close()
    return {"out": str(cfg.out), "obs_modes": list(spec.obs_modes), **store.summary()}


def run_export(cfg: ExportConfig) -> dict:
    """Export; returns a short summary."""
    from dmrl.data.episodes import EpisodeStore
    from dmrl.data.importers.lerobot_export import export_lerobot

    store = EpisodeStore.open(cfg.store)
    info = export_lerobot(
        store,
        cfg.out,
        fps=cfg.fps,
        vcodec=cfg.vcodec,
        crf=cfg.crf,
        g=cfg.gop,
        pix_fmt=cfg.pix_fmt,
        robot_type=cfg.robot_type,
        overwrite=cfg.overwrite,
    )
    return {
        "out": str(cfg.out),
        "episodes": info["total_episodes"],
        "frames": info["total_frames"],
        "features": list(info["features"]),
    }


def run_data(cfg: DataCommand) -> None:
    """The ``dmrl data`` runner: one JSON line of results on stdout."""
    result = run_import(cfg.cmd) if isinstance(cfg.cmd, ImportConfig) else run_export(cfg.cmd)
    print(json.dumps(result, default=str))
