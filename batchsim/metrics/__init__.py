"""Records of a run and the numbers computed from them.

- :mod:`.columns`: the chunked columnar storage the logs are built on;
- :mod:`.iterations`: the per-iteration log, stored as runs of iterations;
- :mod:`.requests`: the per-request table and each finished request's token runs;
- :mod:`.timing`: iterations' start and end times, and the inter-token gaps;
- :mod:`.summary`: the summary with vLLM ``benchmark_serving`` names plus batchsim's own;
- :mod:`.writers`: CSV and JSON output.

This package imports no simpy and no scheduler policy.
"""
