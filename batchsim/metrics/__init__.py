"""Records of a run and the numbers computed from them.

- :mod:`.logs`: the per-iteration log, the per-request table and the token log;
- :mod:`.summary`: the summary with vLLM ``benchmark_serving`` names plus batchsim's own;
- :mod:`.writers`: CSV and JSON output.

This package imports no simpy and no scheduler policy.
"""
