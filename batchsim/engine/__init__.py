"""The simulated serving engine.

- :mod:`.engine`: the SimPy step loop;
- :mod:`.dispatch`: many engines behind a router on one SimPy environment (with
  :mod:`.engine`, the only modules that import simpy); :mod:`.plan`: a replica's stretches,
  logged when they end;
- :mod:`.kv_cache`: the paged KV cache (block accounting);
- :mod:`.request`: a request's lengths, progress and timestamps.
"""
