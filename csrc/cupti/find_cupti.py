"""Find the CUPTI headers and library that blink._cupti builds against (used by setup.py).

Standalone on purpose (no blink import: setup.py runs it before blink._C exists). Run it to see
what a build would use: ``python csrc/cupti/find_cupti.py`` prints one JSON object.

BLINK_WITH_CUPTI: unset or "auto" builds blink._cupti when a usable CUPTI is found; "0" never
builds it; "1" requires it (the build fails, naming what was searched, when none is usable).
BLINK_CUPTI_ROOT: a directory with include/ and lib64/ (or lib/) to try before anything else.

A CUPTI is usable when its headers (cupti_activity.h, and cuda.h next to them or in another
CUDA include directory) and its library (libcupti.so.N) are for the same CUDA major version as
the torch build: torch itself loads libcupti.so.N, and a process must hold one CUPTI only.
Searched in order: BLINK_CUPTI_ROOT; the nvidia-* wheels torch depends on (site-packages/nvidia/
cu13, nvidia/cuda_cupti, ...); $CUDA_HOME / $CUDA_PATH (extras/CUPTI too); /usr/local/cuda and
/usr/local/cuda-*; Triton's bundled copy.
"""
from __future__ import annotations

import glob
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

ENV_SWITCH = "BLINK_WITH_CUPTI"
ENV_ROOT = "BLINK_CUPTI_ROOT"


@dataclass
class CuptiFound:
    include_dirs: list[str]
    library_dir: str
    library: str  # file name, e.g. libcupti.so.13 (linked as -l:libcupti.so.13)
    api_version: int
    cuda_major: int
    source: str


@dataclass
class Search:
    found: CuptiFound | None = None
    torch_cuda: str | None = None
    tried: list[str] = field(default_factory=list)  # "where: why not"

    @property
    def reason(self) -> str:
        if self.found is not None:
            return ""
        if self.torch_cuda is None:
            return "torch is a CPU-only build (torch.version.cuda is None)"
        tail = "; ".join(self.tried[-6:]) if self.tried else "no candidate directories"
        return (f"no CUPTI for CUDA {self.torch_cuda.split('.')[0]} found (searched: {tail}); "
                f"set {ENV_ROOT} to a directory with include/cupti_activity.h and "
                "lib64/libcupti.so.N")


def _api_version(include_dir: str) -> int | None:
    path = os.path.join(include_dir, "cupti_version.h")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            m = re.search(r"#define\s+CUPTI_API_VERSION\s+(\d+)", f.read())
    except OSError:
        return None
    return int(m.group(1)) if m else None


def _cuda_major_of_api(version: int) -> int:
    # CUDA 13 numbers CUPTI_API_VERSION as 130001; CUDA 12.x used 18..2x, 11.x used < 18.
    if version >= 10000:
        return version // 10000
    return 12 if version >= 18 else 11


def _cuda_h_major(include_dir: str) -> int | None:
    try:
        with open(os.path.join(include_dir, "cuda.h"), encoding="utf-8", errors="replace") as f:
            m = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", f.read())
    except OSError:
        return None
    return int(m.group(1)) // 1000 if m else None


def _library(lib_dir: str, major: int) -> str | None:
    name = f"libcupti.so.{major}"
    return name if os.path.exists(os.path.join(lib_dir, name)) else None


def _site_dirs(torch_dir: str | None) -> list[str]:
    dirs: list[str] = []
    if torch_dir:
        dirs.append(os.path.dirname(torch_dir))
    for p in sys.path:
        if p.endswith("site-packages") and p not in dirs:
            dirs.append(p)
    return dirs


def _default_homes(env: Mapping[str, str]) -> list[str]:
    homes = [env[k] for k in ("CUDA_HOME", "CUDA_PATH") if env.get(k)]
    return homes + ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True)


def _candidates(env: Mapping[str, str], site_dirs: list[str],
                homes: list[str]) -> list[tuple[str, str, list[str]]]:
    """(label, include dir, library dirs) in search order."""
    out: list[tuple[str, str, list[str]]] = []
    root = env.get(ENV_ROOT)
    if root:
        out.append((f"{ENV_ROOT}={root}", os.path.join(root, "include"),
                    [os.path.join(root, "lib64"), os.path.join(root, "lib")]))
    for site in site_dirs:
        for sub in ("cu13", "cu12", "cuda_cupti"):
            base = os.path.join(site, "nvidia", sub)
            out.append((f"wheel nvidia/{sub}", os.path.join(base, "include"),
                        [os.path.join(base, "lib")]))
    seen: set[str] = set()
    for home in homes:
        real = os.path.realpath(home)
        if real in seen:
            continue
        seen.add(real)
        out.append((f"{home}/extras/CUPTI", os.path.join(home, "extras", "CUPTI", "include"),
                    [os.path.join(home, "extras", "CUPTI", "lib64")]))
        out.append((home, os.path.join(home, "include"),
                    [os.path.join(home, "lib64"), os.path.join(home, "lib"),
                     os.path.join(home, "targets", "x86_64-linux", "lib")]))
    for site in site_dirs:
        base = os.path.join(site, "triton", "backends", "nvidia")
        out.append(("triton's bundled CUPTI", os.path.join(base, "include"),
                    [os.path.join(base, "lib", "cupti"),
                     os.path.join(base, "lib", "cupti-blackwell")]))
    return out


def _cuda_h_dirs(include_dir: str, site_dirs: list[str], homes: list[str]) -> list[str]:
    dirs = [include_dir]
    for site in site_dirs:
        dirs += [os.path.join(site, "nvidia", sub, "include")
                 for sub in ("cu13", "cu12", "cuda_runtime", "cuda_nvcc")]
    dirs += [os.path.join(h, "include") for h in homes]
    for site in site_dirs:
        dirs.append(os.path.join(site, "triton", "backends", "nvidia", "include"))
    return dirs


def search(env: Mapping[str, str] | None = None, *, torch_cuda: str | None | bool = False,
           site_dirs: list[str] | None = None, cuda_homes: list[str] | None = None) -> Search:
    """Look for a CUPTI matching torch's CUDA major version. torch_cuda=False: ask torch;
    site_dirs / cuda_homes replace the default site-packages and CUDA install lists (tests)."""
    env = os.environ if env is None else env
    torch_dir = None
    if torch_cuda is False:
        try:
            import torch

            torch_cuda = torch.version.cuda
            torch_dir = os.path.dirname(torch.__file__)
        except ImportError:
            torch_cuda = None
    result = Search(torch_cuda=torch_cuda or None)
    if not torch_cuda:
        return result
    major = int(str(torch_cuda).split(".")[0])
    sites = _site_dirs(torch_dir) if site_dirs is None else site_dirs
    homes = _default_homes(env) if cuda_homes is None else cuda_homes
    for label, inc, lib_dirs in _candidates(env, sites, homes):
        if not os.path.exists(os.path.join(inc, "cupti_activity.h")):
            if label.startswith(ENV_ROOT) or os.path.isdir(inc):
                result.tried.append(f"{label}: no cupti_activity.h in {inc}")
            continue
        version = _api_version(inc)
        if version is None:
            result.tried.append(f"{label}: no CUPTI_API_VERSION in {inc}/cupti_version.h")
            continue
        if _cuda_major_of_api(version) != major:
            result.tried.append(f"{label}: CUPTI API {version} is not for CUDA {major}")
            continue
        lib_dir = next((d for d in lib_dirs if _library(d, major)), None)
        if lib_dir is None:
            result.tried.append(f"{label}: no libcupti.so.{major} in {', '.join(lib_dirs)}")
            continue
        # The CUPTI headers include cuda.h and, through builtin_types.h, crt/host_defines.h,
        # which the nvidia-* runtime wheels do not ship: find a full CUDA include directory.
        cuda_dirs = [d for d in _cuda_h_dirs(inc, sites, homes)
                     if os.path.exists(os.path.join(d, "cuda.h"))
                     and os.path.exists(os.path.join(d, "crt", "host_defines.h"))]
        same = [d for d in cuda_dirs if _cuda_h_major(d) == major]
        if not cuda_dirs:
            result.tried.append(f"{label}: no CUDA include directory with cuda.h and "
                                "crt/host_defines.h (CUDA toolkit, nvidia-cuda-nvcc or Triton)")
            continue
        cuda_dir = (same or cuda_dirs)[0]
        includes = [inc] if cuda_dir == inc else [inc, cuda_dir]
        result.found = CuptiFound(includes, lib_dir, _library(lib_dir, major) or "", version,
                                  major, label)
        return result
    return result


def decide(env: Mapping[str, str] | None = None, **kwargs: object) -> tuple[bool, Search, str]:
    """(build it?, the search, a line for the build log). Raises RuntimeError when
    BLINK_WITH_CUPTI=1 and no usable CUPTI was found."""
    env = os.environ if env is None else env
    switch = env.get(ENV_SWITCH, "auto").strip().lower()
    if switch in ("0", "off", "no", "false"):
        return False, Search(), f"blink._cupti: skipped ({ENV_SWITCH}={env.get(ENV_SWITCH)})"
    if switch not in ("", "auto", "1", "on", "yes", "true"):
        raise RuntimeError(f"{ENV_SWITCH} must be 0, 1 or auto, not {env.get(ENV_SWITCH)!r}")
    found = search(env, **kwargs)  # type: ignore[arg-type]
    if found.found is None:
        if switch in ("1", "on", "yes", "true"):
            raise RuntimeError(f"{ENV_SWITCH}=1 but blink._cupti cannot be built: {found.reason}")
        return False, found, f"blink._cupti: skipped ({found.reason})"
    f = found.found
    return True, found, (f"blink._cupti: building against CUPTI API {f.api_version} "
                         f"(CUDA {f.cuda_major}) from {f.source}: headers "
                         f"{', '.join(f.include_dirs)}, library "
                         f"{os.path.join(f.library_dir, f.library)}")


def main() -> int:
    try:
        build, found, line = decide()
    except RuntimeError as exc:
        print(json.dumps({"build": False, "error": str(exc)}, indent=1))
        return 1
    print(json.dumps({"build": build, "message": line, "torch_cuda": found.torch_cuda,
                      "found": asdict(found.found) if found.found else None,
                      "tried": found.tried}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
