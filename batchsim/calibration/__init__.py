"""``batchsim calibrate``: fit a hardware profile's terms to a user's own measurements.

Modules (one idea each):

- :mod:`~batchsim.calibration.measured`: reading per-operator timings in the CSV layout of
  Vidur's profiler (layer ops, attention, all-reduce, CPU overhead).
- :mod:`~batchsim.calibration.predict`: what the cost model predicts for those points, for any
  values of the terms (a fast, vectorised path for the layer ops).
- :mod:`~batchsim.calibration.search`: the deterministic coordinate search and the fit score.
- :mod:`~batchsim.calibration.fit`: the fit of each family of terms.
- :mod:`~batchsim.calibration.held_out`: the k-fold held-out error per operator group, the
  measured range, and :func:`~batchsim.calibration.held_out.calibrate_ops`, which runs it all.
- :mod:`~batchsim.calibration.e2e`: vLLM ``benchmark_latency`` / ``benchmark_serving`` results,
  simulated and fitted with a few aggregate terms.
- :mod:`~batchsim.calibration.profile`: the written profile YAML and its sources.

The command's options, run and tables are :mod:`batchsim.cli.calibrate`. Nothing here is
imported by a simulation: the CLI loads it when ``calibrate`` runs.
"""
