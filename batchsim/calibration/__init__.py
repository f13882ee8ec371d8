"""``batchsim calibrate``: fit a hardware profile's terms to a user's own measurements.

Modules (one idea each):

- :mod:`~batchsim.calibration.measured`: reading per-operator timings in the CSV layout of
  Vidur's profiler (layer ops, attention, all-reduce, CPU overhead).
- :mod:`~batchsim.calibration.predict`: what the cost model predicts for those points, for any
  values of the terms (a fast, vectorised path for the layer ops).
- :mod:`~batchsim.calibration.fit`: the search, the fit of each family of terms, the k-fold
  held-out error per operator group, the measured range.
- :mod:`~batchsim.calibration.e2e`: vLLM ``benchmark_latency`` / ``benchmark_serving`` results,
  simulated and fitted with a few aggregate terms.
- :mod:`~batchsim.calibration.profile`: the written profile YAML and its sources.

The command's options, run and tables are :mod:`batchsim.cli.calibrate`. Nothing here is
imported by a simulation: the CLI loads it when ``calibrate`` runs.
"""
