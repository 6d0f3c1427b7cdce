"""The `blink` command line."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a zoo name such as torchvision:resnet50 or hf:llama-7b "
                                 "(`blink models` lists them)")
    p.add_argument("--batch-size", "-b", type=int, required=True)
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (text models)")
    p.add_argument("--dtype", default="fp32",
                   help="fp32, bf16, fp16, amp-bf16 or amp-fp16 (default fp32)")
    p.add_argument("--mode", choices=["inference", "train"], default="inference")
    p.add_argument("--optimizer", default="adamw", help="adamw, adam, sgd or none (train mode)")
    p.add_argument("--gpu", default="H200", help="target GPU (`blink gpus` lists them)")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="write JSON instead of the table (to PATH, or stdout without one)")


def _emit(a: argparse.Namespace, table: Callable[[], str],
          to_json: Callable[[str | None], str]) -> None:
    """The table, or JSON to stdout (--json) or to a file (--json PATH)."""
    if a.json is None:
        print(table())
    elif a.json == "-":
        sys.stdout.write(to_json(None) + "\n")
    else:
        to_json(a.json)
        print(f"wrote {a.json}")


def _cmd_trace(a: argparse.Namespace) -> int:
    from .dryrun import trace_model

    t = trace_model(a.model, batch_size=a.batch_size, seq_len=a.seq_len, dtype=a.dtype,
                    mode=a.mode, optimizer=a.optimizer, gpu=a.gpu)
    _emit(a, t.summary, t.to_json)
    return 0


def _cmd_predict(a: argparse.Namespace) -> int:
    from .predict import predict

    p = predict(a.model, batch_size=a.batch_size, seq_len=a.seq_len, dtype=a.dtype, mode=a.mode,
                optimizer=a.optimizer, gpu=a.gpu,
                expandable_segments=True if a.expandable_segments else None,
                predictor=a.predictor)
    if a.chrome_trace:
        p.to_chrome_trace(a.chrome_trace)
        print(f"timeline written to {a.chrome_trace} (open in ui.perfetto.dev)", file=sys.stderr)
    _emit(a, lambda: p.table(max_rows=a.top), p.to_json)
    return 0


def _cmd_models(a: argparse.Namespace) -> int:
    from .zoo import ZOO

    for name, e in sorted(ZOO.items()):
        print(f"{name:<32} {e.kind:<8} family={e.family}")
    return 0


def _cmd_gpus(a: argparse.Namespace) -> int:
    from .hardware import get_gpu, list_gpus

    print(f"{'gpu':<14} {'arch':<7} {'SMs':>4} {'mem GiB':>8} {'TB/s':>6} {'bf16 TFLOP/s':>13}")
    for name in list_gpus():
        g = get_gpu(name)
        bf16 = g.peak_flops.get("bf16") or g.peak_flops.get("fp16") or 0.0
        print(f"{g.name:<14} {g.arch:<7} {g.sm_count:>4} {g.memory_bytes / 2**30:>8.0f} "
              f"{g.memory_bandwidth_bytes_per_s / 1e12:>6.2f} {bf16 / 1e12:>13.1f}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blink", description=__doc__)
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
    p.add_argument("--top", type=int, default=15, help="op rows in the table (default 15)")
    p.add_argument("--predictor", choices=["auto", "analytic"], default="auto",
                   help="auto: trained models in models/ (or $BLINK_MODELS_DIR) where they cover "
                        "a unit, else analytic; analytic: ignore trained models")
    p.set_defaults(func=_cmd_predict)
    from .collect.cli import add_collect_parser

    add_collect_parser(sub)
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
