"""The dashboard in a real headless Chromium (Debian's chromium + chromium-driver, installed by
scripts/install_browser.sh), driven through WebDriver against a real `blink serve` on loopback:
the page loads, a prediction renders its charts, the planner draws its curves with the budget
line, a comparison draws its bars, the history shows a measured value from a collected dataset
next to the prediction, and the GPU monitor is hidden with a note on this GPU-less machine.
Screenshots go to tests/output/ (or $BLINK_TEST_OUTPUT); their paths are printed."""
from __future__ import annotations

import os
import shutil

import pytest
from service_helpers import ROOT, start, stop

import blink

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="needs Debian's chromium and chromium-driver (bash scripts/install_browser.sh)")

OUT = os.environ.get("BLINK_TEST_OUTPUT") or os.path.join(ROOT, "tests", "output")
MEASURED_MS = 1.2345  # the measured time written into the test's dataset below


def _dataset(path: str) -> str:
    """A one-run dataset in blink.collect's format: torchvision:resnet18, batch 2, fp32
    inference, features for H200, measured 1.2345 ms and 150 MiB reserved (values made up
    here to test the join, not measurements)."""
    from blink.collect.dataset import DatasetWriter

    w = DatasetWriter(path, preset="smoke", device="cuda", protocol={"samples": 1},
                      env={"gpu_name": "NVIDIA H200"}, env_id="e0", feature_columns=[],
                      planned=1)
    w.append({"run_id": "r0", "kind": "model", "status": "ok", "model": "torchvision:resnet18",
              "batch_size": 2, "seq_len": None, "dtype": "fp32", "mode": "inference",
              "device": "cuda", "feature_gpu": "H200", "gpu_name": "NVIDIA H200",
              "time_median_s": MEASURED_MS / 1e3, "peak_reserved_bytes": 150 << 20,
              "env_id": "e0"}, [])
    w.finish("complete")
    return path


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    tmp = str(tmp_path_factory.mktemp("dash"))
    server = start(tmp, "--dataset", _dataset(os.path.join(tmp, "measured")))
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1280,1000", f"--user-data-dir={os.path.join(tmp, 'chrome')}"]:
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=opts)
    driver.set_page_load_timeout(60)
    try:
        driver.get(server.url + "/dashboard/")
        yield driver, server
    finally:
        driver.quit()
        stop(server)


def _wait(driver, js: str, timeout: float = 120.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.25).until(
        lambda d: d.execute_script("return " + js))


def _set(driver, element_id: str, value: str) -> None:
    driver.execute_script(
        "const e = document.getElementById(arguments[0]); e.value = arguments[1];"
        "e.dispatchEvent(new Event('change'));", element_id, value)


def _shot(driver, name: str, section: str | None = None) -> str:
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, name)
    if section:
        driver.execute_script("document.getElementById(arguments[0]).scrollIntoView()", section)
    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(1280, min(max(1000, height + 120), 6000))
    driver.save_screenshot(path)
    driver.set_window_size(1280, 1000)
    assert os.path.getsize(path) > 10_000
    print(f"screenshot: {path}")
    return path


def test_page_loads_with_the_catalogue(page):
    driver, _ = page
    assert driver.title == "Blink dashboard"
    _wait(driver, "document.body.getAttribute('data-ready') === '1'")
    names = driver.execute_script(
        "return [...document.querySelectorAll('#model-names option')].map(o => o.value)")
    assert names == blink.zoo.list_models()
    gpus = driver.execute_script(
        "return [...document.getElementById('p-gpu').options].map(o => o.value)")
    assert "H200" in gpus and "A100-40GB" in gpus


def test_a_prediction_renders_its_charts_and_joins_the_measured_history(page):
    driver, _ = page
    _wait(driver, "document.body.getAttribute('data-ready') === '1'")
    _set(driver, "p-model", "torchvision:resnet18")
    _set(driver, "p-batch", "2")
    _set(driver, "p-gpu", "H200")
    driver.find_element("id", "predict-run").click()
    _wait(driver, "!document.getElementById('predict-result').hidden")
    p = blink.predict("torchvision:resnet18", batch_size=2, gpu="H200", host_time="table")
    ops = {u.op for u in p.units}
    bars = driver.execute_script("return document.querySelectorAll('#op-chart rect.bar').length")
    assert bars == min(12, len(ops))
    assert driver.execute_script(
        "return document.querySelectorAll('#module-chart rect.bar').length") >= 1
    host = driver.execute_script(
        "return document.querySelectorAll('#timeline-chart rect.host').length")
    gpu = driver.execute_script(
        "return document.querySelectorAll('#timeline-chart rect.gpu').length")
    assert host >= 1 and gpu >= 1
    summary = driver.find_element("id", "predict-summary").text
    assert f"{p.time_ms:.3f} ms" in summary and "fits" in summary
    # the history: the prediction, next to the measured value of the same configuration
    _wait(driver, "document.querySelectorAll('#history-table tr.has-measured').length > 0")
    row = driver.find_element("css selector", "#history-table tr.has-measured").text
    assert "torchvision:resnet18" in row and f"{MEASURED_MS:.3f}" in row
    assert "150.0 MiB" in row
    _shot(driver, "dashboard_predict.png", "predict")


def test_a_transformers_config_typed_into_the_page_is_predicted(page):
    driver, _ = page
    _wait(driver, "document.body.getAttribute('data-ready') === '1'")
    driver.find_element("id", "p-use-config").click()
    assert driver.find_element("id", "p-config").is_displayed()
    _set(driver, "p-config", '{"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4, '
                             '"vocab_size": 1000, "n_positions": 256, "bos_token_id": 0, '
                             '"eos_token_id": 0}')
    _set(driver, "p-batch", "2")
    _set(driver, "p-seq", "64")
    driver.find_element("id", "predict-run").click()
    _wait(driver, "document.getElementById('predict-summary').textContent.includes('config:gpt2')")
    assert driver.execute_script(
        "return document.querySelectorAll('#op-chart rect.bar').length") >= 5
    # the same config trained with its own activation checkpointing
    _set(driver, "p-mode", "train")
    driver.find_element("id", "p-ckpt").click()
    driver.find_element("id", "predict-run").click()
    _wait(driver, "document.getElementById('predict-summary').textContent"
                  ".includes('train, grad checkpointing')")
    driver.find_element("id", "p-ckpt").click()
    _set(driver, "p-mode", "inference")
    # a broken config is an error on the page, not a stale chart
    _set(driver, "p-config", '{"model_type": "gpt2", "n_layer": 100000}')
    driver.find_element("id", "predict-run").click()
    _wait(driver, "document.getElementById('predict-status').className.includes('error')")
    assert "at most 256" in driver.find_element("id", "predict-status").text
    assert driver.execute_script("return document.getElementById('predict-result').hidden")
    driver.find_element("id", "p-use-config").click()  # back to model names
    _set(driver, "p-seq", "")


def test_the_planner_draws_its_curves_and_the_budget_line(page):
    driver, _ = page
    _wait(driver, "document.body.getAttribute('data-ready') === '1'")
    _set(driver, "b-model", "torchvision:resnet18")
    _set(driver, "b-gpu", "A100-40GB")
    _set(driver, "b-budget", "2GiB")
    _set(driver, "b-max", "1024")
    driver.find_element("id", "plan-run").click()
    _wait(driver, "!document.getElementById('plan-result').hidden", timeout=240)
    s = blink.optimize_batch("torchvision:resnet18", gpu="A100-40GB", memory_budget="2GiB",
                             max_batch=1024)
    for chart in ("plan-time", "plan-throughput", "plan-memory"):
        assert driver.execute_script(
            f"return document.querySelectorAll('#{chart} path.line').length") == 1
        dots = driver.execute_script(f"return document.querySelectorAll('#{chart} circle').length")
        assert dots == len(s.rows)
    assert driver.execute_script(
        "return document.querySelectorAll('#plan-memory circle.oom').length") == sum(
            not r.fits for r in s.rows)
    assert driver.execute_script(
        "return document.querySelectorAll('#plan-memory line.budget').length") == 1
    assert f"largest batch that fits: {s.max_batch_size}" in driver.find_element(
        "id", "plan-summary").text
    _shot(driver, "dashboard_planner.png", "planner")


def test_compare_draws_bars_and_the_gpu_monitor_is_hidden_with_a_note(page):
    driver, _ = page
    _wait(driver, "document.body.getAttribute('data-ready') === '1'")
    _set(driver, "c-models", "torchvision:resnet18, torchvision:mobilenet_v2")
    _set(driver, "c-batch", "4")
    _set(driver, "c-dtypes", "fp32")
    driver.find_element("id", "compare-run").click()
    _wait(driver, "!document.getElementById('compare-result').hidden", timeout=240)
    checked = driver.execute_script(
        "return [...document.querySelectorAll('#c-gpus input:checked')].length")
    bars = driver.execute_script("return document.querySelectorAll('#compare-chart rect').length")
    assert bars == 2 * checked
    # no NVIDIA GPU here: the live section is hidden and the note says why
    assert driver.execute_script("return document.getElementById('nvml-section').hidden")
    note = driver.find_element("id", "nvml-note").text
    assert "hidden" in note and "NVIDIA" in note
    _shot(driver, "dashboard_compare.png", "compare")
