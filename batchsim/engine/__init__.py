"""The simulated serving engine.

- :mod:`.engine`: the SimPy step loop (the only module that imports simpy);
- :mod:`.kv_cache`: the paged KV cache (block accounting);
- :mod:`.request`: a request's lengths, progress and timestamps.
"""
