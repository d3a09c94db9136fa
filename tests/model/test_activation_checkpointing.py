"""Activation checkpointing recomputes layers in backward without changing any number."""

import torch

from model.config import PAD_ID, ModelConfig
from model.loss import label_smoothed_loss
from model.transformer import Transformer


def loss_and_grads(model: Transformer, src: torch.Tensor, tgt: torch.Tensor, seed: int):  # type: ignore[no-untyped-def]
    model.zero_grad()
    torch.manual_seed(seed)  # same dropout masks in both runs
    logits = model(src, tgt[:, :-1])
    loss, _, _ = label_smoothed_loss(logits, tgt[:, 1:], 0.1)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_checkpointed_layers_give_the_same_loss_and_gradients() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=40, d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2,
        dropout=0.2, attention_dropout=0.1, activation_dropout=0.1,
    )  # fmt: skip
    model = Transformer(cfg).train()
    src = torch.randint(4, 40, (3, 9))
    src[0, 6:] = PAD_ID
    tgt = torch.randint(4, 40, (3, 8))
    tgt[1, 5:] = PAD_ID
    plain_loss, plain_grads = loss_and_grads(model, src, tgt, seed=7)
    model.set_activation_checkpointing(True)
    ckpt_loss, ckpt_grads = loss_and_grads(model, src, tgt, seed=7)
    assert model.encoder.checkpoint_layers and model.decoder.checkpoint_layers
    assert torch.equal(plain_loss, ckpt_loss)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(ckpt_grads[name], grad, rtol=0, atol=1e-6, msg=name)


def test_checkpointing_keeps_fewer_activations() -> None:
    cfg = ModelConfig(vocab_size=40, d_model=64, n_heads=4, d_ff=256, encoder_layers=4,
                      decoder_layers=4, dropout=0.0)  # fmt: skip
    model = Transformer(cfg).train()
    src = torch.randint(4, 40, (8, 32))
    tgt = torch.randint(4, 40, (8, 32))

    def saved_bytes() -> int:
        total = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(src, tgt).sum().backward()
        return total

    plain = saved_bytes()
    model.set_activation_checkpointing(True)
    assert saved_bytes() < plain / 2
