"""The acceptance run's pure half: what runs and what passes (spec), parsing of workload
output and the agent's / nvidia-smi's text (parse), the region file's bytes (region), the
evaluation of every cell (evaluate: standard group and two-process check; physical: issue 8's
group; lockstop: the stopped lock holder) and results.md (report).

No subprocesses, threads, clocks or files here: everything is a function of its arguments,
unit-tested without a GPU in gpu/test_acceptance.py. The runner (run_acceptance.py and
gpu/runner/) gathers the inputs.
"""
