"""The Transformer of "Attention Is All You Need" in plain torch.nn.

config (shapes, special ids), embedding (scaled tokens + sinusoidal positions), attention
(multi-head attention, masks, key/value cache), layers (encoder/decoder layers), cache
(decoder state between steps), transformer (the model), loss (label-smoothed CE), search
(greedy and beam search), params (closed-form parameter count).
"""
