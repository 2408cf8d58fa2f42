"""Bring your own data: LeRobotDataset v3 and robomimic HDF5 into the episode store, and the store out as LeRobot v3.

Optional dependencies (the ``data`` extra): pyarrow (parquet), av (PyAV: mp4), h5py (HDF5); each is imported where
it is used, so ``import dmrl.data`` never needs them.
"""

from dmrl.data.importers.cli import DataCommand, ExportConfig, ImportConfig, run_export, run_import
from dmrl.data.importers.mapping import KeyMap, load_mapping

__all__ = ["DataCommand", "ExportConfig", "ImportConfig", "KeyMap", "load_mapping", "run_export", "run_import"]
