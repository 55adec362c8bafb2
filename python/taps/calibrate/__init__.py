"""Calibration: a cluster's per-level latency and bandwidth fitted to measured collective times
(docs/calibrate.md). :mod:`~taps.calibrate.measurements` reads them (a CSV file, or what
nccl-tests prints), :mod:`~taps.calibrate.fit` fits them by least squares on the core's own
pricing, :mod:`~taps.calibrate.cluster_file` writes the cluster TOML the core reads back."""

from taps.calibrate.cluster_file import cluster_toml
from taps.calibrate.fit import Fit, fit
from taps.calibrate.measurements import Measurement, read_csv, read_nccl_tests

__all__ = ["Fit", "Measurement", "cluster_toml", "fit", "read_csv", "read_nccl_tests"]
