"""Episode data: a crash-safe zarr episode store, per-key normalisation, Diffusion Policy windows and chunk-level
transitions for TD learning."""

from dmrl.data._zarr_utils import StoreError, StoreExistsError
from dmrl.data.episodes import FORMAT_VERSION, META_COLUMNS, TEXT_COLUMNS, EpisodeStore
from dmrl.data.nonfinite import NonFiniteError, nonfinite_report, require_finite
from dmrl.data.normalizer import MissingStatError, Normalizer, RunningStats, fit_normalizer
from dmrl.data.sequence import SequenceDataset, split_episodes
from dmrl.data.transitions import ChunkTransitionDataset

__all__ = [
    "ChunkTransitionDataset",
    "FORMAT_VERSION",
    "META_COLUMNS",
    "TEXT_COLUMNS",
    "EpisodeStore",
    "MissingStatError",
    "NonFiniteError",
    "Normalizer",
    "RunningStats",
    "SequenceDataset",
    "StoreError",
    "StoreExistsError",
    "fit_normalizer",
    "nonfinite_report",
    "require_finite",
    "split_episodes",
]
