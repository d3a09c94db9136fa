"""DeepSpeed's pieces: its config generated from ours (config.py), its JIT-compiled ops built
ahead of training (ops.py), and the model inside its engine (engine.py)."""
