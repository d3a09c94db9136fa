"""Slurm: cluster profiles (cluster.py) and, on the submitting side, the run's batch script
(script.py) and its submission (submit.py); inside the allocation, the job's steps (job.py)
and the rendezvous port of each try (rendezvous.py)."""
