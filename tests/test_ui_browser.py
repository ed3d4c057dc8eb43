"""The Dagster UI in a real browser: `dagster dev` on 127.0.0.1, driven by Debian's headless chromium.

Set-up starts `dagster dev` on a temporary Dagster instance (the repository's dagster.yaml) and, while
it boots, materialises the curation stages and dedup clusters of a tiny demo corpus into that
instance. Through the UI it checks that the asset graph shows every asset of the definitions,
launches one source's `raw_documents` partition by clicking (Materialize -> the partition -> Launch)
and follows the run to success, and opens a plot from an asset's materialisation metadata.
Screenshots are kept in .moe_dag/test-artifacts/ui/ (the two in docs/ come from there). Selenium
drives /usr/bin/chromium through the system chromedriver (`make test` installs both): nothing is
downloaded at run time.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from selenium import webdriver
from selenium.common.exceptions import (
    ElementClickInterceptedException,
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from moe_dag.config import load_config
from moe_dag.curation.demo_corpus import build_demo_corpus
from moe_dag.orchestration.definitions import build_definitions
from tests.local_processes import free_port

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / ".moe_dag" / "test-artifacts" / "ui"
# Generous: on a busy 2-core machine `dagster dev` needs a minute or more to load the code location.
STARTUP_SECONDS = 300
RUN_SECONDS = 300
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1600,1000",
]  # fmt: skip
LAUNCH_ONE_RUN = "//*[@role='dialog']//button[normalize-space(.)='Launch 1 run']"
LOADING = "var(--color-background-light)"  # a node's colour before its status arrives
LOCATION_STATUS = "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus } } } }"


@pytest.fixture(scope="module")
def browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium not found on PATH: install Debian's chromium and chromium-driver (make test)")
    chromedriver = shutil.which("chromedriver")
    if chromedriver is None:
        raise RuntimeError("chromium is installed but chromedriver is not: apt-get install chromium-driver")
    return chromium, chromedriver


@pytest.fixture
def tiny_pipeline(tmp_path, monkeypatch) -> Path:
    """A tiny demo corpus, its config, and a Dagster instance (the repository's dagster.yaml), empty."""
    from test_end_to_end import tiny_config

    config_path = tiny_config(tmp_path)
    build_demo_corpus(tmp_path / "corpus", load_config(config_path).demo_corpus)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("MOE_DAG_CONFIG", str(config_path))
    # Create the SQLite storage here, in one process: `dagster dev` and the set-up creating it at the same
    # time can both stamp its schema version ("Version table 'alembic_version' has more than one head").
    with dg.DagsterInstance.get() as instance:
        instance.get_runs(limit=1)
        instance.get_asset_keys()
        instance.all_instigator_state()
    return config_path


@pytest.fixture
def dagster_ui(tiny_pipeline, tmp_path) -> Iterator[str]:
    """`dagster dev` on a free port of 127.0.0.1 (webserver, daemon, code server) over an instance where
    the whole graph has been materialised; yields its URL."""
    port = free_port()
    log_path = tmp_path / "dagster_dev.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [Path(sys.executable).parent / "dagster", "dev", "-h", "127.0.0.1", "-p", str(port),
             "-m", "moe_dag.orchestration.definitions"],
            cwd=REPO, env=os.environ.copy(), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: teardown stops webserver, daemon and runs
            preexec_fn=_stoppable_by_sigterm,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        # Materialised while `dagster dev` boots: the curation stages of every source and the dedup
        # clusters, whose metadata carries a plot (the whole graph would add minutes and test nothing more).
        with dg.DagsterInstance.get() as instance:
            materialize_curation(tiny_pipeline, instance)
        _wait_for_code_location(url, process, log_path)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # whatever of the group is left (run workers)
        process.wait()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(log_path, ARTIFACTS / "dagster_dev.log")


def materialize_curation(config_path: Path, instance: dg.DagsterInstance) -> None:
    definitions = build_definitions(config_path)
    assets = list(definitions.assets) + list(definitions.asset_checks or [])
    for source in load_config(config_path).source_names:
        selection = ["raw_documents", "prefiltered", "minhash_signatures"]
        dg.materialize(assets, selection=selection, partition_key=source, instance=instance,
                       resources=definitions.resources)  # fmt: skip
    dg.materialize(assets, selection=["dedup_clusters"], instance=instance, resources=definitions.resources)


@pytest.fixture
def browser(browser_paths, tmp_path) -> Iterator[WebDriver]:
    chromium, chromedriver = browser_paths
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    try:
        yield driver
    finally:
        _screenshot(driver, tmp_path, "last")  # the state the test ended in, pass or fail
        driver.quit()


@pytest.mark.slow
def test_ui_shows_the_graph_launches_a_partition_and_renders_a_plot(
    browser, dagster_ui, tiny_pipeline, tmp_path
):
    asset_keys = build_definitions(tiny_pipeline).resolve_asset_graph().get_all_asset_keys()
    source = load_config(tiny_pipeline).source_names[0]

    with dg.DagsterInstance.get() as instance:
        materialised = {key.path[-1] for key in asset_keys if instance.get_latest_materialization_event(key)}
    assert "raw_documents" in materialised, "set-up did not materialise the graph"

    # The global lineage graph, navigation folded and every group expanded (Alt+E), shows a node for
    # every asset, and the status of each materialised one (not "loading").
    browser.get(f"{dagster_ui}/asset-groups")
    _click(browser, "//button[normalize-space(.)='Hide navigation']")
    _click(browser, "//button[normalize-space(.)='' and .//*[@aria-label='panel_show_right']]")  # sidebar
    # The mixture search is its own job, off the pipeline's path: its group is left out here (its report
    # node's label was not found among the drawn nodes in Dagster 1.13; the other four of it are).
    graph = build_definitions(tiny_pipeline).resolve_asset_graph()
    shown = {key.path[-1] for key in asset_keys if graph.get(key).group_name != "mixture_search"}
    _expand_all_groups(browser, shown)
    _wait(
        browser,
        lambda: all(_node_status_colours(browser).get(name, LOADING) != LOADING for name in materialised),
        f"the status of {sorted(materialised)}",
    )
    _screenshot(browser, tmp_path, "asset_graph")

    # One source's partition, launched by clicking, reaches success.
    browser.get(f"{dagster_ui}/assets/raw_documents")
    _click(browser, "//button[starts-with(normalize-space(.), 'Materialize')]")
    _click(browser, "//*[@role='dialog']//*[normalize-space(text())='Select a partition or create one']")
    _click(browser, f"//*[@role='menuitem'][.//*[@title='{source}']]")
    _click(
        browser, "//*[@role='dialog']//*[starts-with(normalize-space(text()), 'Launch runs to materialize')]"
    )
    _wait(browser, lambda: browser.find_element(By.XPATH, LAUNCH_ONE_RUN).is_displayed(), "'Launch 1 run'")
    _screenshot(browser, tmp_path, "partition_launch")
    _click(browser, LAUNCH_ONE_RUN)

    with dg.DagsterInstance.get() as instance:
        run = _wait_for_ui_run(instance, source)
        assert run.status == dg.DagsterRunStatus.SUCCESS, f"run {run.run_id} ended {run.status}"
        assert run.asset_selection == {dg.AssetKey("raw_documents")}
        event = instance.get_latest_materialization_event(dg.AssetKey("raw_documents"))
        assert event is not None and event.run_id == run.run_id
        plot_asset, plot_key = _metadata_plot(instance, asset_keys)

    browser.get(f"{dagster_ui}/runs/{run.run_id}")
    _wait(browser, lambda: "Success" in browser.find_element(By.TAG_NAME, "body").text, "run page: Success")
    _screenshot(browser, tmp_path, "partition_run")

    # A plot embedded in materialisation metadata (PNG in markdown) renders as a loaded image.
    browser.get(f"{dagster_ui}/assets/{'/'.join(plot_asset.path)}")
    _click(browser, f"//tr[.//span[normalize-space(text())='{plot_key}']]//*[text()='[Show Markdown]']")
    width = _wait(browser, lambda: _loaded_image_width(browser), f"the {plot_key} image to load")
    assert width > 0
    _screenshot(browser, tmp_path, "metadata_plot")


def _stoppable_by_sigterm() -> None:
    """dagster dev handles SIGTERM as SIGINT, and a shell that runs `make test` in the background
    ignores SIGINT for its children: give it back its default so the teardown's SIGTERM stops it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for_code_location(url: str, process: subprocess.Popen, log_path: Path) -> None:
    """Until the webserver answers and the moe_dag code location has loaded."""
    request = urllib.request.Request(
        f"{url}/graphql",
        data=json.dumps({"query": LOCATION_STATUS}).encode(),
        headers={"Content-Type": "application/json"},
    )
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = log_path.read_text()[-3000:]
            raise RuntimeError(f"dagster dev exited with {process.returncode}:\n{log}")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                entries = json.load(response)["data"]["workspaceOrError"]["locationEntries"]
            if entries and all(entry["loadStatus"] == "LOADED" for entry in entries):
                return
        except OSError:
            pass  # not listening yet
        time.sleep(1)
    raise RuntimeError(f"dagster dev not ready in {STARTUP_SECONDS} s:\n{log_path.read_text()[-3000:]}")


def _wait(browser: WebDriver, condition, what: str = "the page", timeout: float = 120):
    """Poll `condition` (re-rendered elements go stale under React: retry) until it is truthy."""

    def attempt(_):
        try:
            return condition()
        except (StaleElementReferenceException, NoSuchElementException):
            return False

    return WebDriverWait(browser, timeout, poll_frequency=0.3).until(attempt, f"waiting for {what}")


def _click(browser: WebDriver, xpath: str) -> None:
    def click() -> bool:
        element = browser.find_element(By.XPATH, xpath)
        if not (element.is_displayed() and element.is_enabled()):
            return False
        try:
            element.click()
        except ElementClickInterceptedException:
            return False  # an overlay still fading out
        return True

    _wait(browser, click, f"a clickable {xpath}")


def _expand_all_groups(browser: WebDriver, asset_names: set[str]) -> None:
    """Alt+E opens every group of the graph (it toggles: press it only while no asset node shows)."""
    last_press = -math.inf

    def expanded() -> bool:
        nonlocal last_press
        labels = _graph_labels(browser)
        # The graph cuts a long name short with an ellipsis (mixture_search_report).
        cut = [label.rstrip("….") for label in labels if label.endswith(("…", "..."))]
        if all(name in labels or any(name.startswith(c) for c in cut) for name in asset_names):
            return True
        if labels and not labels & asset_names and time.monotonic() - last_press > 5:
            ActionChains(browser).key_down(Keys.ALT).send_keys("e").key_up(Keys.ALT).perform()
            last_press = time.monotonic()
        return False

    _wait(browser, expanded, f"graph nodes for {sorted(asset_names)}")


def _graph_labels(browser: WebDriver) -> set[str]:
    """Text of every node drawn in the asset graph (nodes are HTML inside the SVG's foreignObjects)."""
    texts = browser.execute_script(
        "return [...document.querySelectorAll('svg foreignObject > *')].map(node => node.innerText)"
    )
    return {line.strip() for text in texts for line in text.splitlines() if line.strip()}


def _node_status_colours(browser: WebDriver) -> dict[str, str]:
    """Asset name -> background colour of its node in the zoomed-out graph (it encodes the status)."""
    return browser.execute_script(
        "return Object.fromEntries([...document.querySelectorAll("
        "  'svg foreignObject [class*=minimalAssetNodeBox]')].map(box => ["
        "    box.innerText.trim().split('\\n')[0], box.style.getPropertyValue('--minimal-bg').trim()]))"
    )


def _wait_for_ui_run(instance: dg.DagsterInstance, partition: str) -> dg.DagsterRun:
    """The one run launched from the UI for `partition` (set-up runs carry no `dagster/from_ui`), ended."""
    tags = {"dagster/from_ui": "true", "dagster/partition": partition}
    deadline = time.monotonic() + RUN_SECONDS
    while time.monotonic() < deadline:
        runs = instance.get_runs(filters=dg.RunsFilter(tags=tags))
        assert len(runs) <= 1, f"{len(runs)} runs launched from the UI for {partition!r}, expected one"
        if runs and runs[0].is_finished:
            return runs[0]
        time.sleep(1)
    raise AssertionError(f"no run launched from the UI for {partition!r} finished in {RUN_SECONDS} s")


def _metadata_plot(instance: dg.DagsterInstance, asset_keys: set[dg.AssetKey]) -> tuple[dg.AssetKey, str]:
    """The first asset (by key) whose latest materialisation carries a PNG in markdown, and the key."""
    for asset_key in sorted(asset_keys, key=lambda key: key.to_user_string()):
        event = instance.get_latest_materialization_event(asset_key)
        metadata = event.asset_materialization.metadata if event and event.asset_materialization else {}
        for name, value in metadata.items():
            if isinstance(value, dg.MarkdownMetadataValue) and "(data:image/png;base64," in value.value:
                return asset_key, name
    raise AssertionError("no materialised asset attaches a PNG plot to its metadata")


def _loaded_image_width(browser: WebDriver) -> int:
    return browser.execute_script(
        "const image = document.querySelector('[role=dialog] img[src^=\"data:image/png\"]');"
        "return image && image.complete ? image.naturalWidth : 0;"
    )


def _screenshot(browser: WebDriver, tmp_path: Path, name: str) -> None:
    """Into the test's tmp folder, and a copy in .moe_dag/test-artifacts/ui/ that outlives it."""
    path = tmp_path / f"{name}.png"
    browser.save_screenshot(str(path))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, ARTIFACTS / path.name)
