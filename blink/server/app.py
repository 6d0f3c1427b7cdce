"""The FastAPI application: routes, the worker, the cache, errors as answers.

Blink's dry run installs process-wide hooks while it traces (module forward hooks, the SDPA
override), so two traces must never overlap in one process: all blink work runs on ONE worker
thread, off the event loop (/health and the dashboard's files answer while it works). Requests
wait for it in a bounded queue; a full queue is 429 with Retry-After. A request whose answer
takes longer than max_wall_s gets 504; searches and comparisons also stop at that deadline,
and the queue slot is only freed when the work has really ended, so the bound is honest.
Identical requests (after normalising GPU and dtype names) are answered from an LRU cache, and
one that arrives while its twin is being computed waits for the same result.
"""

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response

from .. import __version__
from ..errors import BlinkError, ConfigError, UnknownGPUError
from .history import History
from .limits import Limits
from .models import (
    TASKS,
    build_config_model,
    check_config,
    check_name,
    config_inputs,
    name_params,
)
from .schemas import ErrorBody, GpuInfo, Health, ModelInfo, ModelList, Schemas

# Host time from the fixed table: a service's CPU is not the caller's training host, and equal
# requests must get equal (cacheable) answers.
HOST_TIME = "table"


class HTTPProblem(Exception):
    def __init__(self, status: int, detail: str, error: str = "",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.error = status, detail, error
        self.headers = headers or {}


class LRUCache:
    """Answers (JSON bytes) by request key, bounded in entries and bytes."""

    def __init__(self, entries: int, max_bytes: int) -> None:
        self._d: OrderedDict[str, bytes] = OrderedDict()
        self._entries, self._max_bytes, self._bytes = entries, max_bytes, 0
        self.hits = self.misses = 0

    def get(self, key: str) -> bytes | None:
        v = self._d.get(key)
        if v is None:
            self.misses += 1
            return None
        self._d.move_to_end(key)
        self.hits += 1
        return v

    def put(self, key: str, value: bytes) -> None:
        if self._entries <= 0 or len(value) > self._max_bytes:
            return
        old = self._d.pop(key, None)
        if old is not None:
            self._bytes -= len(old)
        self._d[key] = value
        self._bytes += len(value)
        while len(self._d) > self._entries or self._bytes > self._max_bytes:
            _, v = self._d.popitem(last=False)
            self._bytes -= len(v)

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._d), "bytes": self._bytes, "hits": self.hits,
                "misses": self.misses}


class _BodyLimit:
    """ASGI middleware: bodies over max_body_bytes get 413 before the app reads them."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    too_big = int(v) > self.max_bytes
                except ValueError:
                    too_big = True
                if too_big:
                    await self._reject(send)
                    return
        seen = 0

        async def limited() -> dict:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge()
            return msg

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._reject(send)

    async def _reject(self, send: Callable) -> None:
        body = json.dumps({"detail": f"request body over {self.max_bytes} bytes",
                           "error": "PayloadTooLarge"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


class Worker:
    """One thread for all blink work, a bounded admission count, the cache and in-flight
    de-duplication. Everything but the work itself runs on the event loop thread."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="blink-worker")
        self.cache = LRUCache(limits.cache_entries, limits.cache_bytes)
        self.admitted = 0
        self.pending: dict[str, asyncio.Future] = {}
        self.computed: dict[str, int] = {"predict": 0, "optimize-batch": 0, "compare": 0}
        self.closing = False

    async def run(self, endpoint: str, key: str, fn: Callable[[], bytes]) -> tuple[bytes, str]:
        hit = self.cache.get(key)
        if hit is not None:
            return hit, "hit"
        fut = self.pending.get(key)
        state = "joined"
        if fut is None:
            if self.closing:
                raise HTTPProblem(503, "the service is shutting down", "Unavailable")
            if self.admitted >= self.limits.max_queue:
                raise HTTPProblem(429, f"busy: {self.admitted} requests are queued or running "
                                       f"(max_queue={self.limits.max_queue}); retry shortly",
                                  "TooManyRequests", {"Retry-After": "2"})
            self.admitted += 1
            state = "miss"

            def work() -> bytes:
                self.computed[endpoint] += 1  # counted where the work happens
                return fn()

            fut = asyncio.wrap_future(self.pool.submit(work))
            self.pending[key] = fut
            fut.add_done_callback(lambda f: self._done(key, f))
        try:
            result = await asyncio.wait_for(asyncio.shield(fut), timeout=self.limits.max_wall_s)
        except TimeoutError:
            raise HTTPProblem(504, f"no answer within max_wall_s={self.limits.max_wall_s:g} s; "
                                   "the work goes on and its answer is cached for a retry",
                              "Timeout") from None
        return result, state

    def _done(self, key: str, fut: asyncio.Future) -> None:
        self.admitted -= 1
        self.pending.pop(key, None)
        if not fut.cancelled() and fut.exception() is None:
            self.cache.put(key, fut.result())

    def shutdown(self) -> None:
        self.closing = True
        self.pool.shutdown(wait=False, cancel_futures=True)


def _key(endpoint: str, body: dict[str, Any]) -> str:
    return endpoint + ":" + json.dumps(body, sort_keys=True, separators=(",", ":"))


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def create_app(limits: Limits | None = None, *, history_path: str | None = None,
               datasets: list[str] | None = None, dashboard: bool = True) -> FastAPI:
    """The service. history_path: JSON file of past predictions ("" keeps them in memory only;
    None: the default under the user's cache dir). datasets: collected dataset directories
    whose measured runs are shown next to matching predictions."""
    from ..dryrun import DTYPES, normalize_dtype
    from ..hardware import get_gpu, list_gpus
    from ..plan import MAX_COMPARE_CELLS, TimeLimitError, compare, optimize_batch, parse_bytes
    from ..predict import predict
    from ..zoo import ZOO

    lim = limits or Limits()
    schemas = Schemas(lim)
    worker = Worker(lim)
    history = History(lim.history_entries, history_path, datasets or [])
    app = FastAPI(
        title="Blink", version=__version__,
        description="Predict a PyTorch model's time and GPU memory without running it on that "
                    "GPU. Limits: " + ", ".join(f"{k}={v}" for k, v in lim.to_dict().items()))
    app.state.worker = worker
    app.state.limits = lim
    app.state.history = history
    errors = {422: {"model": ErrorBody}, 429: {"model": ErrorBody}, 504: {"model": ErrorBody}}

    # -- errors as answers -------------------------------------------------------------------
    @app.exception_handler(HTTPProblem)
    async def _problem(request: Request, exc: HTTPProblem) -> JSONResponse:
        return JSONResponse({"detail": exc.detail, "error": exc.error}, exc.status,
                            headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Not echoing the input: it may be huge or not text.
        detail = [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))[:300],
                   "type": str(e.get("type", ""))} for e in exc.errors()[:20]]
        return JSONResponse({"detail": detail, "error": "ValidationError"}, 422)

    def blink_error(exc: BlinkError) -> HTTPProblem:
        if isinstance(exc, TimeLimitError):
            return HTTPProblem(504, str(exc), "Timeout")
        return HTTPProblem(422, str(exc)[:2000], type(exc).__name__)

    # -- request normalisation (on the loop: cheap, no model is built) -----------------------
    def gpu_name(name: str, where: str = "gpu") -> str:
        try:
            return get_gpu(name).name
        except UnknownGPUError as exc:
            raise HTTPProblem(422, f"{where}: {exc}", "UnknownGPUError") from None

    def dtype_name(dt: str) -> str:
        try:
            return normalize_dtype(dt)
        except ConfigError as exc:
            raise HTTPProblem(422, str(exc), "ConfigError") from None

    def budget_bytes(value: int | str | None) -> int | None:
        if value is None:
            return None
        try:
            return parse_bytes(value)
        except ConfigError as exc:
            raise HTTPProblem(422, f"memory_budget: {exc}", "ConfigError") from None

    def model_target(req: Any) -> tuple[Any, dict[str, Any]]:
        """(what to call the work with, the normalised model part of the cache key)."""
        if isinstance(req.model, str):
            try:
                return check_name(req.model), {"model": req.model}
            except ConfigError as exc:
                raise HTTPProblem(422, str(exc), "ConfigError") from None
        try:
            cfg = check_config(req.model, lim.max_config_keys)
        except ConfigError as exc:
            raise HTTPProblem(422, str(exc), "ConfigError") from None
        if req.task not in TASKS:
            raise HTTPProblem(422, f"task must be one of {', '.join(TASKS)}", "ConfigError")
        return cfg, {"model": cfg, "task": req.task}

    def check_input_shape(shape: list[int] | None) -> None:
        if shape is None:
            return
        n = 1
        for d in shape[1:]:
            n *= d
        if n > lim.max_input_elements:
            raise HTTPProblem(422, f"input_shape has {n} elements per sample; this server's "
                                   f"limit is {lim.max_input_elements}", "ConfigError")

    # -- the work (on the worker thread) -----------------------------------------------------
    def check_params(n: int, label: str) -> None:
        if n > lim.max_params:
            raise ConfigError(f"{label} has {n:,} parameters; this server's limit is "
                              f"{lim.max_params:,} (max_params)")

    def resolve(target: Any, task: str,
                input_shape: list[int] | None) -> tuple[Any, dict[str, Any], str]:
        """(model for blink.predict, extra predict kwargs, label)."""
        if isinstance(target, str):
            check_params(name_params(target), target)
            extra: dict[str, Any] = {}
            if input_shape is not None:
                extra["input_shape"] = tuple(input_shape)
            return target, extra, target
        built = build_config_model(target, task)
        check_params(built.params, built.label)
        if input_shape is not None:
            raise ConfigError("input_shape does not apply to a config model (its inputs come "
                              "from the config and seq_len)")
        return built, {}, built.label

    def predict_one(target: Any, task: str, *, batch_size: int, seq_len: int | None,
                    dtype: str, mode: str, gpu: str, budget: int | None, optimizer: str,
                    input_shape: list[int] | None, expandable: bool = False,
                    grad_checkpointing: bool = False, kv_cache: int | None = None) -> Any:
        model, extra, label = resolve(target, task, input_shape)
        if not isinstance(model, str):
            inputs = config_inputs(model, batch_size, seq_len, DTYPES[dtype][0], mode == "train")
            p = predict(model.module, inputs, dtype=dtype, mode=mode, gpu=gpu,
                        memory_budget=budget, optimizer=optimizer,
                        expandable_segments=expandable, host_time=HOST_TIME,
                        grad_checkpointing=grad_checkpointing, kv_cache=kv_cache)
            p.model, p.batch_size, p.seq_len = label, batch_size, seq_len
            return p
        return predict(model, batch_size=batch_size, seq_len=seq_len, dtype=dtype, mode=mode,
                       gpu=gpu, memory_budget=budget, optimizer=optimizer,
                       expandable_segments=expandable, host_time=HOST_TIME,
                       grad_checkpointing=grad_checkpointing, kv_cache=kv_cache, **extra)

    def guarded(fn: Callable[[], bytes]) -> Callable[[], bytes]:
        def run() -> bytes:
            try:
                return fn()
            except BlinkError as exc:
                raise blink_error(exc) from None
        return run

    async def answer(endpoint: str, key_body: dict[str, Any], fn: Callable[[], bytes]) -> Response:
        body, state = await worker.run(endpoint, _key(endpoint, key_body), guarded(fn))
        return Response(body, media_type="application/json", headers={"X-Blink-Cache": state})

    # -- routes ------------------------------------------------------------------------------
    @app.get("/health", response_model=Health, tags=["service"])
    async def health() -> Health:
        return Health(status="ok", version=__version__, queued=worker.admitted,
                      cache=worker.cache.stats(), computed=dict(worker.computed))

    @app.get("/limits", tags=["service"])
    async def limits_route() -> dict[str, Any]:
        return lim.to_dict()

    @app.get("/gpus", response_model=list[GpuInfo], tags=["catalogue"])
    async def gpus() -> list[GpuInfo]:
        out = []
        for name in list_gpus():
            g = get_gpu(name)
            out.append(GpuInfo(name=g.name, aliases=list(g.aliases), arch=g.arch,
                               compute_capability=list(g.compute_capability),
                               sm_count=g.sm_count, memory_bytes=g.memory_bytes,
                               memory_bandwidth_bytes_per_s=g.memory_bandwidth_bytes_per_s,
                               peak_flops=dict(g.peak_flops)))
        return out

    @app.get("/models", response_model=ModelList, tags=["catalogue"])
    async def models() -> ModelList:
        from .models import NAME_PATTERN

        return ModelList(models=[ModelInfo(name=e.name, family=e.family, kind=e.kind)
                                 for _, e in sorted(ZOO.items())],
                         name_pattern=NAME_PATTERN, config_tasks=list(TASKS))

    @app.post("/predict", tags=["predict"], responses=errors,
              response_description="the Prediction JSON of `blink predict --json`")
    async def predict_route(req: schemas.PredictRequest) -> Response:
        target, key = model_target(req)
        gpu = gpu_name(req.gpu)
        dtype = dtype_name(req.dtype)
        budget = budget_bytes(req.memory_budget)
        check_input_shape(req.input_shape)
        key.update(gpu=gpu, dtype=dtype, batch_size=req.batch_size, seq_len=req.seq_len,
                   mode=req.mode, optimizer=req.optimizer, memory_budget=budget,
                   input_shape=req.input_shape, expandable_segments=req.expandable_segments,
                   grad_checkpointing=req.grad_checkpointing, kv_cache=req.kv_cache)

        def work() -> bytes:
            p = predict_one(target, req.task, batch_size=req.batch_size, seq_len=req.seq_len,
                            dtype=dtype, mode=req.mode, gpu=gpu, budget=budget,
                            optimizer=req.optimizer, input_shape=req.input_shape,
                            expandable=req.expandable_segments,
                            grad_checkpointing=req.grad_checkpointing, kv_cache=req.kv_cache)
            history.add(p)
            return p.to_json().encode()

        return await answer("predict", key, work)

    @app.post("/optimize-batch", tags=["plan"], responses=errors,
              response_description="rows of (batch, time, throughput, peak reserved, fits) "
                                   "and the best batch within the budget")
    async def optimize_route(req: schemas.OptimizeBatchRequest) -> Response:
        target, key = model_target(req)
        gpu = gpu_name(req.gpu)
        dtype = dtype_name(req.dtype)
        budget = budget_bytes(req.memory_budget)
        check_input_shape(req.input_shape)
        key.update(gpu=gpu, dtype=dtype, seq_len=req.seq_len, mode=req.mode,
                   optimizer=req.optimizer, memory_budget=budget, input_shape=req.input_shape,
                   batch_sizes=req.batch_sizes, max_batch=req.max_batch,
                   safety_margin=req.safety_margin, grad_checkpointing=req.grad_checkpointing)
        deadline = lim.max_wall_s

        def work() -> bytes:
            model, extra, _ = resolve(target, req.task, req.input_shape)
            if not isinstance(model, str):
                raise ConfigError("optimize-batch takes a model name; for a config model, "
                                  "POST /predict at the batch sizes you want")
            s = optimize_batch(model, gpu=gpu, batch_sizes=req.batch_sizes,
                               memory_budget=budget, mode=req.mode, dtype=dtype,
                               seq_len=req.seq_len, safety_margin=req.safety_margin,
                               max_batch=req.max_batch, time_limit_s=deadline,
                               optimizer=req.optimizer, host_time=HOST_TIME,
                               grad_checkpointing=req.grad_checkpointing, **extra)
            return _dumps(s.to_dict())

        return await answer("optimize-batch", key, work)

    @app.post("/compare", tags=["plan"], responses=errors,
              response_description="rows of (model, gpu, dtype, time, throughput, memory, "
                                   "fits, relative), fastest first")
    async def compare_route(req: schemas.CompareRequest) -> Response:
        names = []
        for m in req.models:
            try:
                names.append(check_name(m))
            except ConfigError as exc:
                raise HTTPProblem(422, str(exc), "ConfigError") from None
        gpus = [gpu_name(g, "gpus") for g in req.gpus]
        dtypes = [dtype_name(d) for d in req.dtypes]
        cells = len(names) * len(gpus) * len(dtypes)
        if cells > min(lim.max_compare_cells, MAX_COMPARE_CELLS):
            raise HTTPProblem(422, f"{cells} (model, gpu, dtype) combinations; this server's "
                                   f"limit is {lim.max_compare_cells}", "ConfigError")
        budget = budget_bytes(req.memory_budget)
        key = {"models": names, "gpus": gpus, "dtypes": dtypes, "batch_size": req.batch_size,
               "seq_len": req.seq_len, "mode": req.mode, "memory_budget": budget,
               "grad_checkpointing": req.grad_checkpointing}

        def work() -> bytes:
            for n in names:
                check_params(name_params(n), n)
            c = compare(names, gpus, dtypes, batch_size=req.batch_size, mode=req.mode,
                        seq_len=req.seq_len, memory_budget=budget, time_limit_s=lim.max_wall_s,
                        host_time=HOST_TIME, grad_checkpointing=req.grad_checkpointing)
            return _dumps(c.to_dict())

        return await answer("compare", key, work)

    @app.get("/history", tags=["service"])
    async def history_route() -> dict[str, Any]:
        return {"entries": history.entries(), "datasets": history.dataset_info()}

    @app.get("/nvml", tags=["service"])
    async def nvml_route() -> dict[str, Any]:
        from .nvml import sample

        return await asyncio.get_running_loop().run_in_executor(None, sample)

    if dashboard:
        from ..dashboard import mount

        mount(app)

        @app.get("/", include_in_schema=False)
        async def root() -> RedirectResponse:
            return RedirectResponse("/dashboard/")

    @app.on_event("shutdown")
    async def _shutdown() -> None:
        worker.shutdown()

    app.add_middleware(_BodyLimit, max_bytes=lim.max_body_bytes)
    return app


def serve(host: str = "127.0.0.1", port: int = 8765, limits: Limits | None = None,
          **kwargs: Any) -> None:
    """Run the service with uvicorn until interrupted."""
    import uvicorn

    app = create_app(limits, **kwargs)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                            limit_concurrency=max(64, 4 * (limits or Limits()).max_queue))
    server = uvicorn.Server(config)
    print(f"blink serve: http://{host}:{port} (OpenAPI: /docs, dashboard: /dashboard/)",
          flush=True)
    t0 = time.monotonic()
    try:
        server.run()
    finally:
        print(f"blink serve: stopped after {time.monotonic() - t0:.0f} s", flush=True)

