"""The cost model behind `paperscale plan` (launch/cmd_plan.py): memory per rank for each ZeRO
stage and the batch that fits (plan.py, activations.py), time per step (speed.py), the size and
time of a checkpoint (save.py), time to a target quality (quality.py), and the table (table.py)."""
