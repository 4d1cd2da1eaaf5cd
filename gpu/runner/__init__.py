"""The acceptance run's process half: launching and timing out processes, the agent, and the
phases of each group (standard, physical, lockstop) as mixins of run_acceptance.Runner. The
verdicts come from the pure package gpu/acceptance/.
"""
