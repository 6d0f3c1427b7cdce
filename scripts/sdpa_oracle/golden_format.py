"""The codes in tests/data/sdpa_oracle_golden.json.gz, shared by its writer and its reader.

Imported by ``gen_cases.py`` / ``oracle.py`` / ``make_golden.py`` (which write the file) and by
``tests/test_sdpa.py`` (which reads it). Plain Python: no torch here.
"""

from __future__ import annotations

# case["dtype"] and case["mask_dtype"]: the name of the torch dtype of each code.
DTYPE_NAMES = {
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "fp64": "float64",
    "bool": "bool",
}
# config["selected"]: one letter per case, the backend select_sdp_backend chose.
SELECTED_CODES = {"flash": "F", "efficient": "E", "cudnn": "C", "math": "M", "error": "X"}
# config["usable"]: one hex digit per case, the sum of the bits of the usable fused kernels.
USABLE_BITS = {"flash": 1, "efficient": 2, "cudnn": 4}
