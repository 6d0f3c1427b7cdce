"""Known values in a dry run: .item() on tensors the code made from constants is answered as
the GPU answers it, so models whose Python reads such tensors (transformers' mask helpers) trace.
"""
from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch

import blink
from blink import dryrun
from blink.known_values import KnownValues


def _padding_free(make: Callable[..., torch.Tensor]) -> object:
    # transformers' _ignore_causal_mask_sdpa on an all-ones mask: bool, slice, sum == numel
    mask = make(2, 8, dtype=torch.long).bool()[:, 2:]
    return (mask.sum() == mask.numel()).item()


def _pad_in_ids(make: Callable[..., torch.Tensor]) -> object:
    # PreTrainedModel.warn_if_padding_and_no_attention_mask: pad_token_id in input_ids[:, [-1, 0]]
    ids = make(3, 5, dtype=torch.long) * 7
    return 0 in ids[:, [-1, 0]]


def _reductions(make: Callable[..., torch.Tensor]) -> object:
    x = make(4, 6, dtype=torch.float32) * 2.5
    return (x.sum().item(), x.sum(dim=1).amax().item(), x.mean().item(), (x > 1).all().item(),
            torch.cat([x, x]).max().item(), (~(x == 2.5)).any().item(),
            x.to(torch.int64).sum(dim=[0, 1]).item())


def _where_and_fill(make: Callable[..., torch.Tensor]) -> object:
    m = make(2, 3, dtype=torch.bool)
    z = torch.zeros(2, 3, device=m.device)
    return (torch.where(m, z + 4, z).min().item(), z.masked_fill(m, 9.0).sum().item(),
            torch.full((2, 2), 3, device=m.device).eq(3).all().item())


def _shifted_ids(make: Callable[..., torch.Tensor]) -> object:
    # transformers' shift_tokens_right (ProphetNet asserts on it; FSMT checks it for padding)
    ids = make(2, 6, dtype=torch.long) * 5
    shifted = ids.new_zeros(ids.shape)
    shifted[..., 1:] = ids[..., :-1].clone()
    shifted[..., 0] = 2
    shifted.masked_fill_(shifted == -100, 1)
    return torch.all(shifted >= 0).item(), bool(shifted.eq(1).any())


def _window_mask(make: Callable[..., torch.Tensor]) -> object:
    # Longformer: a mask from an all-ones one, through where() on a condition not known here
    mask = make(1, 8, dtype=torch.float32)
    cond = torch.arange(8, device=mask.device) < 5  # values a dry run does not follow
    extended = torch.where(cond, 1.0 - mask * 0.0 - 1.0, torch.finfo(torch.float32).min)
    return (extended > 0).flatten().any().item()


def _unpacked_positions(make: Callable[..., torch.Tensor]) -> object:
    # transformers' find_packed_sequence_indices on arange position ids (a training step with
    # no attention mask and no cache: gradient checkpointing): one sequence per row -> None
    from transformers.masking_utils import find_packed_sequence_indices

    device = make(1, dtype=torch.long).device
    pos = torch.arange(0, 300, device=device).unsqueeze(0).expand(4, -1)
    return find_packed_sequence_indices(pos) is None


def _position_arithmetic(make: Callable[..., torch.Tensor]) -> object:
    device = make(1, dtype=torch.long).device
    a = torch.arange(5, 805, 2, device=device)
    b = torch.arange(0, 400, device=device) * 2 + 5  # the same progression, made another way
    joined = torch.cat([a[:3], a[3:]])
    return ((a - b == 0).all().item(), (joined[1::3] - a[1::3]).eq(0).all().item(),
            a[-1].item(), a[10:20].amax().item(), (a[:4] > 4).all().item(), a.min().item(),
            int(torch.diff(a).max()), (a.unsqueeze(1) - 5)[7, 0].item())


@pytest.mark.parametrize("fn", [_padding_free, _pad_in_ids, _reductions, _where_and_fill,
                                _shifted_ids, _window_mask, _unpacked_positions,
                                _position_arithmetic])
def test_meta_answers_match_cpu(fn):
    def cpu(*shape, dtype):
        return torch.ones(*shape, dtype=dtype)

    def meta(*shape, dtype):
        return torch.ones(*shape, dtype=dtype, device="meta")

    expected = fn(cpu)
    with KnownValues() as follow:
        got = fn(meta)
    assert got == expected
    assert follow.answered >= 1


def test_unknown_or_overwritten_values_still_raise():
    with KnownValues():
        x = torch.empty(4, device="meta")  # no value
        with pytest.raises(RuntimeError, match="meta"):
            x.sum().item()
        m = torch.ones(4, device="meta")
        view = m[:2]
        m.copy_(x)  # an in-place write of unknown values: no view of m is known any more
        with pytest.raises(RuntimeError, match="meta"):
            view.sum().item()
        with pytest.raises(RuntimeError, match="meta"):
            m.sum().item()
        m.fill_(2.0)  # a uniform fill: known again
        assert m.sum().item() == 8.0
        torch._foreach_mul_([m], 3.0)  # in place on a tensor known in full: still known
        assert m.sum().item() == 24.0
        m.add_(x[0])  # an in-place op with an unknown operand: forgotten
        with pytest.raises(RuntimeError, match="meta"):
            m.sum().item()
        z = torch.zeros(4, device="meta")
        z[1:] = torch.ones(3, device="meta")  # a partial write of known values
        assert (z >= 0).all().item() and not (z > 1).any().item()
        assert z.sum().item() == 3.0
        z[:2] = x[:2]  # a partial write of unknown values: the other view is forgotten too
        with pytest.raises(RuntimeError, match="meta"):
            z[2:].sum().item()


TINY_BART = {"model_type": "bart", "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
             "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
             "decoder_ffn_dim": 128, "vocab_size": 1000, "max_position_embeddings": 256,
             "_task": "seq2seq"}
TINY_DEBERTA = {"model_type": "deberta-v2", "hidden_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 1000,
                "_task": "masked-lm"}


TINY_FSMT = {"model_type": "fsmt", "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
             "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
             "decoder_ffn_dim": 128, "src_vocab_size": 1000, "tgt_vocab_size": 1000,
             "vocab_size": 1000, "langs": ["en", "de"], "_task": "seq2seq"}


@pytest.mark.parametrize("cfg", [TINY_BART, TINY_DEBERTA, TINY_FSMT],
                         ids=["bart", "deberta-v2", "fsmt"])
def test_transformers_models_reading_their_masks_predict(tmp_path, cfg):
    # BART's decoder makes an all-ones mask and transformers asks whether it has padding
    # (.item()); DeBERTa-v2 asks whether pad_token_id is among the input ids; FSMT's training
    # step asks whether its right-shifted labels (written into zeros) hold padding. All failed
    # with DataDependentError before.
    path = tmp_path / f"{cfg['model_type']}.json"
    path.write_text(json.dumps(cfg))
    for mode in ("inference", "train"):
        p = blink.predict(f"hf:{path}", batch_size=2, seq_len=64, mode=mode, dtype="bf16",
                          gpu="H100-SXM")
        assert p.time_ms > 0 and p.peak_allocated_bytes > 0
        if mode == "train" or cfg is not TINY_FSMT:  # FSMT reads its shifted labels only
            assert any(".item() call(s)" in n for n in p.notes)
        assert {u.kind for u in p.units} >= {"gemm", "norm"}
    if cfg is TINY_BART:
        # an all-ones mask is no mask: every attention runs the fused kernel with no mask input
        t = blink.trace_model(f"hf:{path}", batch_size=2, seq_len=64, dtype="bf16",
                              gpu="H100-SXM")
        attn = [op for op in t.ops if op.name == "aten::scaled_dot_product_attention"]
        assert len(attn) == 6  # encoder self, decoder self and cross, two layers each
        assert all(len(op.tensors("inputs")) == 3 for op in attn)


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_following_values_changes_no_cost(mode):
    # The retry mode sends every op through Python: the units, their GPU time and the memory
    # must be those of the plain trace. In training, the detach torch adds when it unpacks a
    # node's saved output under a mode (ReluBackward0, TanhBackward0, SDPA) is not recorded.
    run = dict(batch_size=2, dtype="bf16", gpu="H100-SXM", mode=mode)
    for model, seq_len in (("hf:gpt2", 32), ("torchvision:resnet18", None)):
        traced = blink.trace_model(model, seq_len=seq_len, known_values=True, **run)
        assert traced.meta["items_answered"] == 0  # the mode ran (nothing to answer here)
        plain_trace = blink.trace_model(model, seq_len=seq_len, known_values=False, **run)
        plain = blink.predict_trace(plain_trace, gpu="H100-SXM")
        follow = blink.predict_trace(traced, gpu="H100-SXM")
        # The mode's own frames (PythonDispatchMode, its func(*args) re-entering the op) are
        # not recorded: the op tree is the plain run's.
        assert [(o.name, o.parent, o.depth, o.module) for o in traced.ops] == [
            (o.name, o.parent, o.depth, o.module) for o in plain_trace.ops]
        assert [(u.op, u.time_ms) for u in follow.units] == [(u.op, u.time_ms)
                                                             for u in plain.units]
        assert follow.gpu_busy_ms == plain.gpu_busy_ms
        assert follow.peak_allocated_bytes == plain.peak_allocated_bytes
        assert follow.host_ms == pytest.approx(plain.host_ms, rel=0.01)


@pytest.mark.parametrize("name", ["hf:roberta-base", "hf:t5-small", "hf:llama-3-8b"])
def test_blinks_token_ids_are_one_ordinary_token(name):
    # The token inputs Blink makes are known values: an id the config gives no special role,
    # so "pad_token_id in input_ids" is False, as for an unpadded batch.
    p = dryrun.prepare(name, batch_size=2, seq_len=16, mode="train")
    config = p.net.config.to_dict()
    special = {v for k, v in config.items() if k.endswith("token_id") and isinstance(v, int)}
    assert set(p.known) == {k for k in ("input_ids", "decoder_input_ids", "labels")
                            if k in p.kwargs}
    (token,) = set(p.known.values())
    assert token not in special and 0 <= token < config["vocab_size"]
    plain = dryrun.prepare(torch.nn.Linear(4, 4), input_shape=(2, 4))
    assert plain.known == {}  # the user's own inputs: values unknown


def _max_out_indices(d: str) -> object:
    x = torch.full((2, 3), 5.0, device=d)
    v, i = torch.empty(2, device=d), torch.empty(2, dtype=torch.long, device=d)
    torch.max(x, 1, out=(v, i))
    return i[0].item()


def _outside_view(d: str) -> object:
    b = torch.zeros(4, device=d)
    b[:2].fill_(1)
    return b[:2].as_strided((1,), (1,), 3).item()


def _swapped_data(d: str) -> object:
    x = torch.ones(1, device=d)
    x.data = torch.zeros(1, device=d)
    return x.item()


def _written_arange(d: str) -> object:
    pos = torch.arange(40, device=d).unsqueeze(0)
    pos[0, 3] = 70  # a write into the progression's storage
    return (pos[0, 2:] - pos[0, :-2] == 2).all().item()


# Where torch rounds, overflows, wraps or reinterprets, Python's arithmetic would answer
# differently: such values must stay unknown (an unanswered .item() is safe, a wrong one
# silently changes the traced program).
_TORCH_SEMANTICS = {
    "f32 rounding": lambda d: torch.full((1,), 0.1, device=d).item() == 0.1,
    "f32 vs f64": lambda d: bool(torch.full((1,), 0.1, device=d).double() == 0.1),
    "f16 overflow": lambda d: torch.full((1,), 70000.0, dtype=torch.float16, device=d).item(),
    "f32 overflow": lambda d: bool(torch.ones(1, device=d) * torch.finfo(torch.float32).min * 2
                                   == float("-inf")),
    "int promoted to f32": lambda d: bool(torch.full((1,), 16777217, device=d) == 16777216.0),
    "int32 wraps": lambda d: bool(torch.full((1,), 2**31 - 1, dtype=torch.int32, device=d) + 1
                                  > 0),
    "int64 wraps": lambda d: bool(torch.full((1,), 2**62, device=d) * 4 == 0),
    "uint8 wraps": lambda d: torch.zeros(1, dtype=torch.uint8, device=d).sub(1).item(),
    "uint8 cast": lambda d: torch.full((1,), 300, device=d).to(torch.uint8).item(),
    "view(dtype)": lambda d: torch.ones(1, device=d).view(torch.int32).item(),
    "alpha": lambda d: torch.rsub(torch.ones(1, device=d), 5, alpha=2).item(),
    "f32 sum": lambda d: bool(torch.full((10,), 0.1, device=d).sum() == 1.0),
    "bf16 sum": lambda d: torch.ones(257, dtype=torch.bfloat16, device=d).sum().long().item(),
    "0.1 + 0.2": lambda d: bool(torch.ones(1, device=d) * 0.1 + 0.2 == 0.3),
    "int / 3": lambda d: (torch.ones(1, dtype=torch.long, device=d) / 3).item(),
    "max out= indices": _max_out_indices,
    "as_strided": _outside_view,
    "x.data =": _swapped_data,
    # progressions (arange): only integer ones, only while no write touches them
    "packed positions": lambda d: bool((torch.diff(torch.cat(
        [torch.arange(10, device=d), torch.arange(20, device=d)])) == 1).all()),
    "written arange": _written_arange,
    "float arange": lambda d: bool((torch.arange(0.0, 3.0, 0.1, device=d)[1:] > 0).all()),
    "int32 arange wraps": lambda d: bool((torch.arange(
        2**31 - 40, 2**31 - 1, dtype=torch.int32, device=d) + 30 > 0).all()),
    "arange product": lambda d: (torch.arange(40, device=d) * torch.arange(40, device=d))[
        39].item(),
    "arange floor divide": lambda d: (torch.arange(40, device=d) // 3)[39].item(),
    "arange view": lambda d: torch.arange(40, device=d).view(8, 5)[1, 0].item(),
    "arange repeated": lambda d: bool((torch.arange(40, device=d).repeat(2) < 40).all()),
    "cat of a row progression": lambda d: torch.cat([
        torch.arange(4, device=d).unsqueeze(0),  # varies along dim 1, one row thick in dim 0
        torch.zeros(3, 4, dtype=torch.long, device=d) + torch.arange(1, 4, device=d)[:, None],
    ])[0, 3].item(),
}


@pytest.mark.parametrize("name", sorted(_TORCH_SEMANTICS))
def test_never_answers_differently_from_torch(name):
    fn = _TORCH_SEMANTICS[name]
    real = fn("cpu")
    with KnownValues():
        try:
            got = fn("meta")
        except RuntimeError as e:
            assert "meta" in str(e)  # unknown: the dry run's usual error
            return
    assert got == real
