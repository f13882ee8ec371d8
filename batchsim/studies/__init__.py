"""Studies over many runs: sweeps over a grid of overrides and capacity search.

See :func:`batchsim.studies.sweep.sweep` and :func:`batchsim.studies.capacity.capacity`.
"""
