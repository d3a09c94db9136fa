"""Checkpoints: the manager (manager.py: save, publish, restore, prune), the mechanics on disk
(disk.py: durable writes, free space, the ranks' agreement, universal conversion), background
writes (background.py) and loads that unpickle nothing (safe_load.py)."""
