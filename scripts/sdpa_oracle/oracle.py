"""Run torch's own CUDA SDPA kernel choice (sdp::select_sdp_backend) on a faked GPU.

Not part of Blink: a ground-truth generator for ``blink/sdpa.py``. It calls the C++ functions
``sdp::select_sdp_backend`` and ``sdp::can_use_{flash,mem_efficient,cudnn}_attention`` inside the
installed ``libtorch_cuda.so`` through ctypes, on storage-less tensors whose device is ``cuda``,
while ``libfakecuda.so`` (``fakecuda.c``, loaded with ``LD_PRELOAD``) answers the device and cuDNN
queries. Needs a CUDA build of torch (x86-64 Linux, CUDA 12/13 ``cudaDeviceProp`` layout) but no
GPU.

    LD_PRELOAD=libfakecuda.so BLINK_FAKE_SM=9.0 BLINK_FAKE_CUDNN=91900 \\
        python oracle.py < cases.json > results.json

``cases.json`` is a list of cases as written by ``gen_cases.py``; the output has one
``{"flash", "efficient", "cudnn": bool, "selected": str}`` per case.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from typing import Any

import torch
from golden_format import DTYPE_NAMES

_NAMES = {-1: "error", 0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
DTYPES = {code: getattr(torch, name) for code, name in DTYPE_NAMES.items()}


class SdpParams(ctypes.Structure):
    """sdp::sdp_params: three at::Tensor, optional<at::Tensor>, double, bool, bool."""

    _fields_ = [
        ("query", ctypes.c_void_p),
        ("key", ctypes.c_void_p),
        ("value", ctypes.c_void_p),
        ("attn_mask", ctypes.c_void_p),
        ("attn_mask_engaged", ctypes.c_bool),
        ("dropout", ctypes.c_double),
        ("is_causal", ctypes.c_bool),
        ("enable_gqa", ctypes.c_bool),
    ]


class CudaShell(torch.Tensor):
    """A tensor with sizes, strides, dtype and device ``cuda`` but no storage."""

    @staticmethod
    def __new__(
        cls: type[CudaShell],
        size: tuple[int, ...],
        stride: tuple[int, ...] | None,
        dtype: torch.dtype,
        storage_offset: int = 0,
        requires_grad: bool = False,
    ) -> CudaShell:
        if stride is None:
            stride = torch.empty(size, device="meta").stride()
        return torch.Tensor._make_wrapper_subclass(
            cls,
            size,
            strides=stride,
            storage_offset=storage_offset,
            dtype=dtype,
            device="cuda",
            requires_grad=requires_grad,
        )

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001
        raise RuntimeError(f"CudaShell has no data ({func})")


def _load() -> dict[str, Any]:
    path = torch.__file__.rsplit("/", 1)[0] + "/lib/libtorch_cuda.so"
    lib = ctypes.PyDLL(path)
    symbols: dict[str, int] = {}
    listing = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) == 3:
            symbols.setdefault(parts[2], int(parts[0], 16))
    exported = "_ZN3sdp23can_use_cudnn_attentionERKNS_10sdp_paramsEb"
    base = ctypes.cast(getattr(lib, exported), ctypes.c_void_p).value - symbols[exported]
    can = ctypes.PYFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool)
    select = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
    return {
        "flash": can(base + symbols["_ZN3sdp23can_use_flash_attentionERKNS_10sdp_paramsEb"]),
        "efficient": can(
            base + symbols["_ZN3sdp31can_use_mem_efficient_attentionERKNS_10sdp_paramsEb"]
        ),
        "cudnn": can(base + symbols[exported]),
        "select": select(base + symbols["_ZN3sdp18select_sdp_backendERKNS_10sdp_paramsE"]),
    }


def _tensor(case: dict[str, Any], name: str, dtype: torch.dtype, grad: bool) -> CudaShell:
    stride = case.get(f"{name}_stride")
    return CudaShell(
        tuple(case[name]),
        tuple(stride) if stride is not None else None,
        dtype,
        case.get(f"{name}_offset", 0),
        grad,
    )


def run_case(fns: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    """Ask torch which backends are usable for one case and which one it selects."""
    dtype = DTYPES[case["dtype"]]
    grad = bool(case.get("requires_grad", False))
    q, k, v = (_tensor(case, name, dtype, grad) for name in ("q", "k", "v"))
    mask = None
    if case.get("mask") is not None:
        mask_dtype = DTYPES[case.get("mask_dtype", case["dtype"])]
        mask_case = {"mask": case["mask"], "mask_stride": case.get("mask_stride")}
        mask = _tensor(mask_case, "mask", mask_dtype, bool(case.get("mask_requires_grad")))
    params = SdpParams(
        q._cdata,
        k._cdata,
        v._cdata,
        mask._cdata if mask is not None else 0,
        mask is not None,
        float(case.get("dropout", 0.0)),
        bool(case.get("is_causal", False)),
        bool(case.get("enable_gqa", False)),
    )
    address = ctypes.addressof(params)
    enabled = case.get("enabled") or {}
    backends = torch.backends.cuda
    backends.enable_flash_sdp(enabled.get("flash", True))
    backends.enable_mem_efficient_sdp(enabled.get("efficient", True))
    backends.enable_cudnn_sdp(enabled.get("cudnn", True))
    backends.enable_math_sdp(enabled.get("math", True))
    if case.get("deterministic"):
        torch.use_deterministic_algorithms(True, warn_only=bool(case.get("warn_only", False)))
    try:
        result = {name: bool(fns[name](address, False)) for name in ("flash", "efficient", "cudnn")}
        # select_sdp_backend throws (aborting this process) when nothing is usable.
        if backends.math_sdp_enabled() or any(result.values()):
            result["selected"] = _NAMES[fns["select"](address)]
        else:
            result["selected"] = "error"
    finally:
        torch.use_deterministic_algorithms(False)
        for enable in (
            backends.enable_flash_sdp,
            backends.enable_mem_efficient_sdp,
            backends.enable_cudnn_sdp,
            backends.enable_math_sdp,
        ):
            enable(True)
    return result


def main() -> None:
    """Read cases from stdin, write results to stdout."""
    fns = _load()
    cases = json.load(sys.stdin)
    with torch.enable_grad():
        results = [run_case(fns, case) for case in cases]
    json.dump(
        {
            "torch": torch.__version__,
            "git_version": torch.version.git_version,
            "priority_order": torch._C._get_sdp_priority_order(),
            "results": results,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
