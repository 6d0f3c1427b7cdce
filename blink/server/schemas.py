"""The typed requests and answers of the service. Built per Limits, so the OpenAPI schema states
the bounds the server enforces."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .limits import Limits
from .models import NAME_PATTERN, TASKS

DTYPE_PATTERN = r"^(fp32|bf16|fp16|amp-bf16|amp-fp16|float32|bfloat16|float16)$"
GPU_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_. \-]{0,39}$"
SIZE_PATTERN = r"^[0-9]{1,15}(\.[0-9]{1,6})?\s?([KMGT]i?B?|B)?$"

ModelName = Annotated[str, Field(pattern=NAME_PATTERN, max_length=130,
                                 examples=["torchvision:resnet50", "hf:gpt2"])]
Gpu = Annotated[str, Field(pattern=GPU_PATTERN, max_length=40, examples=["H200"])]
Dtype = Annotated[str, Field(pattern=DTYPE_PATTERN, examples=["bf16"])]
Mode = Literal["inference", "train"]


class Schemas:
    """The request models for one set of limits (classes are made per app)."""

    def __init__(self, limits: Limits) -> None:
        lim = limits
        Batch = Annotated[int, Field(ge=1, le=lim.max_batch_size, strict=True)]  # noqa: N806
        SeqLen = Annotated[int, Field(ge=1, le=lim.max_seq_len, strict=True)]  # noqa: N806
        Dim = Annotated[int, Field(ge=1, le=1 << 20, strict=True)]  # noqa: N806
        Budget = Annotated[  # noqa: N806
            Annotated[int, Field(ge=1, le=1 << 50, strict=True)]
            | Annotated[str, Field(pattern=SIZE_PATTERN, max_length=24)],
            Field(description="bytes the run may use, CUDA context included: an integer or a "
                              "size such as \"40GiB\" (default: the GPU's memory)",
                  examples=["40GiB"])]

        class Common(BaseModel):
            model_config = ConfigDict(extra="forbid")

            model: ModelName | dict[str, Any] = Field(
                description="a model name (GET /models) or a transformers config object with "
                            "a model_type")
            task: Literal[TASKS] = Field(  # type: ignore[valid-type]
                "causal-lm", description="for a config: which head to build")
            seq_len: SeqLen | None = None
            input_shape: list[Dim] | None = Field(
                None, min_length=1, max_length=8,
                description="one input's shape, batch dimension first (replaced by batch_size)")
            gpu: Gpu = "H200"
            dtype: Dtype = "fp32"
            mode: Mode = "inference"
            optimizer: Literal["adamw", "adam", "sgd", "none"] = "adamw"
            memory_budget: Budget | None = None
            grad_checkpointing: bool = Field(
                False, description="train with the model's own activation checkpointing on "
                                   "(mode train only)")

        class PredictRequest(Common):
            batch_size: Batch
            expandable_segments: bool = False
            kv_cache: SeqLen | None = Field(
                None, description="a generation step: seq_len new tokens after this many in "
                                  "the model's KV cache (causal LMs, inference)")

        class OptimizeBatchRequest(Common):
            batch_sizes: list[Batch] | None = Field(
                None, min_length=1, max_length=lim.max_sweep_points,
                description="predict these; without them, search for the largest that fits")
            max_batch: Batch = lim.max_batch_size
            safety_margin: float = Field(0.05, ge=0.0, lt=0.9, allow_inf_nan=False)

        class CompareRequest(BaseModel):
            model_config = ConfigDict(extra="forbid")

            models: list[ModelName] = Field(min_length=1, max_length=lim.max_compare_cells)
            gpus: list[Gpu] = Field(["H200"], min_length=1, max_length=lim.max_compare_cells)
            dtypes: list[Dtype] = Field(["fp32"], min_length=1, max_length=4)
            batch_size: Batch = 1
            seq_len: SeqLen | None = None
            mode: Mode = "inference"
            memory_budget: Budget | None = None
            grad_checkpointing: bool = False

        self.PredictRequest = PredictRequest
        self.OptimizeBatchRequest = OptimizeBatchRequest
        self.CompareRequest = CompareRequest


class ErrorBody(BaseModel):
    detail: str | list[dict[str, Any]]
    error: str = ""


class Health(BaseModel):
    status: str
    version: str
    queued: int
    cache: dict[str, int]
    computed: dict[str, int]


class GpuInfo(BaseModel):
    name: str
    aliases: list[str]
    arch: str
    compute_capability: list[int]
    sm_count: int
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    peak_flops: dict[str, float | None]


class ModelInfo(BaseModel):
    name: str
    family: str
    kind: str


class ModelList(BaseModel):
    models: list[ModelInfo]
    name_pattern: str
    config_tasks: list[str]
