"""A fleet: the cells of a matrix placed on a cluster's nodes by a scheduler (docs/fleet.md).

site.py reads the fleet site file (what the cluster offers, per GPU arch); plan.py places cells on
it, purely; scheduler.py is the seam a scheduler fills (submit, watch, cancel); slurm.py is Slurm's,
through its own commands (sbatch, scontrol, scancel), the only module here that runs anything.
"""
