"""Write tests/data/sdpa_oracle_golden.json.gz: torch's own SDPA choices for many cases.

For every torch install given, every faked GPU (compute capability) and cuDNN version, run
``oracle.py`` (torch's C++ ``select_sdp_backend`` on a faked device) on the cases of
``gen_cases.py`` and store the answers compactly. ``tests/test_sdpa.py`` checks
``blink.sdpa`` against the file. Needs gcc, nm, x86-64 Linux and CUDA builds of torch (no GPU).

    python scripts/sdpa_oracle/make_golden.py \\
        --torch 2.11=/path/to/site-with-torch-2.11 --torch 2.14= ...

``VERSION=PATH`` puts PATH first on PYTHONPATH (an unpacked wheel is enough: ``unzip
torch-2.11.0-*.whl 'torch/*' -d PATH``); an empty PATH uses the running interpreter's torch.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_cases import make_cases  # noqa: E402
from golden_format import SELECTED_CODES, USABLE_BITS  # noqa: E402

HERE = Path(__file__).resolve().parent
# cuDNN of each torch minor's cu130 wheel (nvidia-cudnn-cu13 pin).
WHEEL_CUDNN = {"2.11": 91900, "2.12": 92000, "2.13": 92000, "2.14": 92400}
GPUS = [
    "8.0",
    "8.6",
    "8.7",
    "8.9",
    "9.0",
    "10.0",
    "10.3",
    "10.7",
    "11.0",
    "12.0",
    "12.1",
    "7.5",
    "7.0",
    "6.1",
    "5.0",
    "3.7",
    "12.2",
    "9.1",
]
CUDNN_SWEEP_GPUS = ["9.0", "10.0", "10.7", "11.0"]
CUDNN_SWEEP = [91200, 91500, 91600, 92200, 92300, 92401, 92500, 92600]


def _run(job: tuple[str, str, str, int], shim: str, cases_file: str) -> dict[str, Any]:
    version, site, gpu, cudnn = job
    env = dict(os.environ, LD_PRELOAD=shim, BLINK_FAKE_SM=gpu, BLINK_FAKE_CUDNN=str(cudnn))
    if site:
        env["PYTHONPATH"] = site
    with open(cases_file) as stdin:
        done = subprocess.run(
            [sys.executable, str(HERE / "oracle.py")],
            stdin=stdin,
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"oracle failed for {job}:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout)
    results = out["results"]
    return {
        "torch": version,
        "build": f"{out['torch']} ({out['git_version'][:12]})",
        "sm": gpu,
        "cudnn": cudnn,
        "selected": "".join(SELECTED_CODES[r["selected"]] for r in results),
        "usable": "".join(f"{sum(b for k, b in USABLE_BITS.items() if r[k]):x}" for r in results),
    }


def main() -> None:
    """Parse arguments, run the oracle everywhere, write the golden file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", action="append", required=True, metavar="VERSION=PATH")
    parser.add_argument("--cases", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument(
        "--out", default=str(HERE.parents[1] / "tests" / "data" / "sdpa_oracle_golden.json.gz")
    )
    args = parser.parse_args()
    installs = dict(item.split("=", 1) for item in args.torch)
    cases = make_cases(args.cases, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        shim = os.path.join(tmp, "libfakecuda.so")
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-O2", "-o", shim, str(HERE / "fakecuda.c")], check=True
        )
        cases_file = os.path.join(tmp, "cases.json")
        with open(cases_file, "w") as f:
            json.dump(cases, f)
        jobs = []
        for version, site in installs.items():
            jobs += [(version, site, gpu, WHEEL_CUDNN[version]) for gpu in GPUS]
            jobs += [(version, site, g, c) for g in CUDNN_SWEEP_GPUS for c in CUDNN_SWEEP]
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            configs = list(pool.map(lambda job: _run(job, shim, cases_file), jobs))
    golden = {"format": 1, "seed": args.seed, "cases": cases, "configs": configs}
    data = json.dumps(golden, separators=(",", ":")).encode()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out, "wb", compresslevel=9) as f:
        f.write(data)
    print(f"wrote {args.out}: {len(cases)} cases x {len(configs)} configs")


if __name__ == "__main__":
    main()
