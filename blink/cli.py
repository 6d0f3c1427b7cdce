"""The `blink` command line."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

MODEL_HELP = ("a zoo name (torchvision:resnet50, hf:llama-7b; `blink models`), any "
              "torchvision:<name> or timm:<name>, hf:path/to/config.json, or "
              "path/to/model.py:callable (runs your own code; give --input-shape)")


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--batch-size", "-b", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (text models)")
    p.add_argument("--input-shape", action="append", default=None, metavar="DIMS",
                   help="an input's shape without the batch dimension, e.g. 3,224,224 "
                        "(dtype suffix for integer inputs: 128:int64); repeat for several "
                        "inputs. For models that do not define their inputs")
    p.add_argument("--dtype", default="fp32",
                   help="fp32, bf16, fp16, amp-bf16 or amp-fp16 (default fp32)")
    p.add_argument("--mode", choices=["inference", "train"], default="inference")
    p.add_argument("--optimizer", default="adamw", help="adamw, adam, sgd or none (train mode)")
    p.add_argument("--gpu", default="H200", help="target GPU (`blink gpus` lists them)")
    p.add_argument("--channels-last", action="store_true",
                   help="run the model channels-last (NHWC), as "
                        "model.to(memory_format=torch.channels_last) with 4-D inputs converted")
    p.add_argument("--grad-checkpointing", action="store_true",
                   help="train with the model's own activation checkpointing on "
                        "(transformers' gradient_checkpointing_enable, timm's "
                        "set_grad_checkpointing)")
    p.add_argument("--kv-cache", type=int, default=None, metavar="TOKENS",
                   help="a generation step: --seq-len new tokens (1: one decode step) after "
                        "TOKENS already in the KV cache (transformers causal LMs, inference)")
    p.add_argument("--nonzero", choices=["error", "assume_all"], default="error",
                   help="data-dependent shapes Blink cannot size from known values (nonzero, "
                        "x[mask] of activations): an error (default) or every element "
                        "counted as non-zero, an upper bound")
    p.add_argument("--json", action="store_true",
                   help="print JSON instead of the table (with --out: only to the file)")
    p.add_argument("--out", "-o", metavar="PATH", default=None,
                   help="write the JSON to PATH (the table still prints unless --json)")


def _emit(a: argparse.Namespace, table: Callable[[], str],
          to_json: Callable[[str | None], str]) -> None:
    """The table (or JSON with --json) on stdout; with --out PATH the JSON goes to PATH."""
    if a.out:
        to_json(a.out)
        print(f"wrote {a.out}", file=sys.stderr)
    if a.json and not a.out:
        sys.stdout.write(to_json(None) + "\n")
    elif not a.json:
        print(table())


def _inputs(a: argparse.Namespace) -> object:
    """--input-shape values as meta tensors with the batch dimension (-b) first."""
    if not a.input_shape:
        return None
    import torch

    from .errors import ConfigError

    if a.batch_size is None:
        raise ConfigError("--input-shape needs -b/--batch-size (the batch dimension is added)")
    dtypes = {"int64": torch.int64, "long": torch.int64, "int32": torch.int32,
              "float32": torch.float32, "fp32": torch.float32, "bool": torch.bool}
    out = []
    for text in a.input_shape:
        dims_text, _, dt = text.partition(":")
        try:
            dims = [int(d) for d in dims_text.replace("x", ",").split(",") if d.strip()]
        except ValueError:
            dims = []
        if not dims or any(d <= 0 for d in dims) or (dt and dt not in dtypes):
            raise ConfigError(f"bad --input-shape {text!r}: give positive sizes without the batch "
                              f"dimension, e.g. 3,224,224 or 128:int64 (dtypes: "
                              f"{', '.join(dtypes)})")
        from .dryrun import check_input_size

        dtype = dtypes[dt] if dt else torch.float32
        check_input_size(a.model, a.batch_size, [[a.batch_size, *dims]], dtype.itemsize)
        out.append(torch.empty(a.batch_size, *dims, dtype=dtype, device="meta"))
    return tuple(out)


def _run_kwargs(a: argparse.Namespace) -> dict:
    inputs = _inputs(a)
    return {"inputs": inputs, "batch_size": None if inputs is not None else a.batch_size,
            "seq_len": a.seq_len, "dtype": a.dtype, "mode": a.mode, "optimizer": a.optimizer,
            "gpu": a.gpu, "channels_last": a.channels_last,
            "grad_checkpointing": a.grad_checkpointing, "kv_cache": a.kv_cache,
            "nonzero": a.nonzero}


def _cmd_trace(a: argparse.Namespace) -> int:
    from .dryrun import trace_model

    t = trace_model(a.model, **_run_kwargs(a))
    _emit(a, t.summary, t.to_json)
    return 0


def _cmd_predict(a: argparse.Namespace) -> int:
    from .predict import predict

    p = predict(a.model, **_run_kwargs(a),
                expandable_segments=True if a.expandable_segments else None,
                compiled=a.compiled, host_time=a.host_time, predictor=a.predictor)
    if a.chrome_trace:
        p.to_chrome_trace(a.chrome_trace)
        print(f"timeline written to {a.chrome_trace} (open in ui.perfetto.dev)", file=sys.stderr)
    _emit(a, lambda: p.table(max_rows=a.top, by=a.by, depth=a.depth), p.to_json)
    return 0


def _cmd_models(a: argparse.Namespace) -> int:
    from .zoo import ZOO

    for name, e in sorted(ZOO.items()):
        print(f"{name:<32} {e.kind:<8} family={e.family}")
    print("also: torchvision:<any torchvision.models name>, timm:<any timm model>, "
          "hf:path/to/config.json, path/to/model.py:callable (see `blink predict --help`)")
    return 0


def _cmd_gpus(a: argparse.Namespace) -> int:
    from .hardware import get_gpu, list_gpus

    print(f"{'gpu':<20} {'arch':<7} {'SMs':>4} {'mem GiB':>8} {'TB/s':>6} {'dram':>5}"
          f" {'bf16 TFLOP/s':>13} {'W':>5} {'fp32':>5} {'tc':>5} {'sgemm':>6}")
    for name in list_gpus():
        g = get_gpu(name)
        bf16 = g.peak_flops.get("bf16") or g.peak_flops.get("fp16") or 0.0
        print(f"{g.name:<20} {g.arch:<7} {g.sm_count:>4} {g.memory_bytes / 2**30:>8.0f} "
              f"{g.memory_bandwidth_bytes_per_s / 1e12:>6.2f} {g.dram_efficiency:>5.2f} "
              f"{bf16 / 1e12:>13.1f} "
              f"{g.tdp_w:>5.0f} {g.sustained_fp32_ratio:>5.2f} {g.sustained_tc_ratio:>5.2f} "
              f"{g.simt_gemm_rate:>6.2f}")
    print("dram = fraction of TB/s a streaming kernel reaches (blink/hardware.py "
          "dram_efficiency_rule)")
    print("fp32 / tc = fraction of boost held under dense CUDA-core / tensor-core math "
          "(blink/hardware.py power rule)")
    print("sgemm = share of the FP32 peak an SGEMM keeps (below 1 where FP32 lanes are shared "
          "with INT32, and on Hopper: blink/hardware.py simt_gemm_rate_rule)")
    return 0


def _add_train_parsers(sub: argparse._SubParsersAction) -> None:
    """`blink train` and `blink evaluate` (blink.train; xgboost at training time only)."""

    def _train(a: argparse.Namespace) -> int:
        from .train.__main__ import run

        return run(a)

    def _evaluate(a: argparse.Namespace) -> int:
        from .train.evaluation import run

        return run(a)

    from .train.__main__ import add_arguments as train_args
    from .train.__main__ import add_evaluate_arguments as evaluate_args

    p = sub.add_parser("train", help="fit the per-unit forests and conformal table (models/)")
    train_args(p)
    p.set_defaults(func=_train)
    p = sub.add_parser("evaluate", help="accuracy on held-out GPUs, families and batch sizes")
    evaluate_args(p)
    p.set_defaults(func=_evaluate)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="blink", description=__doc__)
    parser.add_argument("--version", action="version", version=f"blink {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("trace", help="dry-run a model and print its op table")
    _add_run_args(p)
    p.set_defaults(func=_cmd_trace)
    p = sub.add_parser("predict", help="predict time and memory on a target GPU")
    _add_run_args(p)
    p.add_argument("--expandable-segments", action="store_true",
                   help="simulate PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    p.add_argument("--chrome-trace", metavar="PATH", default=None,
                   help="also write the predicted timeline as a Chrome/Perfetto trace")
    p.add_argument("--top", type=int, default=15, help="rows in the table (default 15)")
    p.add_argument("--by", choices=["op", "phase", "module", "kind"], default="op",
                   help="break the time down by op (default), phase, module or unit kind")
    p.add_argument("--depth", type=int, default=1,
                   help="module path depth for --by module (default 1)")
    p.add_argument("--compiled", action="store_true",
                   help="predict the model under torch.compile (Inductor's fused kernels)")
    p.add_argument("--host-time", choices=("table", "measured", "wall"), default="table",
                   help="host time per op: the deterministic table (default), measured on this "
                        "CPU during the dry run (CPU time), or the same on the wall clock")
    p.add_argument("--predictor", choices=["auto", "trees", "analytic"], default="auto",
                   help="auto: trained models in models/ (or $BLINK_MODELS_DIR) where they cover "
                        "a unit, else analytic, and the end-to-end models where they apply; "
                        "trees: the per-unit forests only; analytic: ignore trained models")
    p.set_defaults(func=_cmd_predict)
    from .collect.cli import add_collect_parser

    add_collect_parser(sub)
    from .plan import add_plan_parsers

    add_plan_parsers(sub)
    from .server.cli import add_server_parsers

    add_server_parsers(sub)
    _add_train_parsers(sub)
    sub.add_parser("models", help="list the model zoo").set_defaults(func=_cmd_models)
    sub.add_parser("gpus", help="list the known GPUs").set_defaults(func=_cmd_gpus)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .errors import BlinkError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BlinkError as exc:
        print(f"blink: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
