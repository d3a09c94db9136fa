"""`python -m launch.slurm_job`, the entry point batch scripts of earlier versions call.

Slurm keeps a job's script from its submission, so a job queued or requeued across an upgrade
still runs these commands; they are launch/slurm/job.py's.
"""

import sys

from launch.slurm.job import main

if __name__ == "__main__":
    sys.exit(main())
