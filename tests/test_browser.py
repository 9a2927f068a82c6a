"""The report and the dashboard as a person sees them: headless Chromium (Debian's package) driven by Playwright."""
from __future__ import annotations

import shutil
import threading
from pathlib import Path

import optuna
import pytest
from view_factory import scripted_study

from autotune.results.annotate import artifact_dir
from autotune.results.front import pareto_trials
from autotune.results.report import build_report
from autotune.study.optuna_private import study_id

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).is_file(),
                                reason="Debian's chromium is not installed (scripts/setup.sh installs it)")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    folder = tmp_path_factory.mktemp("browser")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOTUNE_CACHE", str(folder / "cache"))
        return scripted_study(folder)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium refuses its sandbox.
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def _page(browser, errors: list[str]):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return page


@pytest.mark.slow
def test_report_renders_every_benchmarked_trial_without_errors(study, browser, tmp_path):
    st, _, recipes = study
    out = tmp_path / "report.html"
    out.write_text(build_report(st, recipes), encoding="utf-8")
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(out.as_uri())
    page.wait_for_selector("#pareto .scatterlayer path.point")
    benchmarked = sum(t.state == optuna.trial.TrialState.COMPLETE for t in st.trials)
    # One marker per benchmarked trial plus the speed baseline's star.
    assert page.locator("#pareto .scatterlayer path.point").count() == benchmarked + 1
    assert page.locator("#outcomes .scatterlayer path.point").count() == len(st.trials)
    assert page.locator("#history .scatterlayer path.point").count() == 3 * benchmarked
    assert "best-throughput" in page.inner_text("#pareto")
    assert errors == []
    page.close()


@pytest.fixture(scope="module")
def dashboard(study):
    from autotune.results.dashboard import make_dashboard_server

    _, url, _ = study
    server = make_dashboard_server(url, artifact_dir(url), "127.0.0.1", 0)  # a free loopback port
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_dashboard_shows_the_study_its_trials_and_a_pareto_note(study, browser, dashboard):
    st, _, _ = study
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(f"{dashboard}/dashboard")
    page.get_by_text(st.study_name, exact=False).first.wait_for()
    best = pareto_trials(st)[0]
    page.goto(f"{dashboard}/dashboard/studies/{study_id(st)}/trials?numbers={best.number}")
    page.get_by_text(f"Pareto point #{best.number}").wait_for(timeout=20_000)
    body = page.inner_text("body")
    assert f"{len(st.trials)} Trials" in body
    # The list is virtualised (only the rows in view exist), so check the count and the first rows.
    assert all(f"Trial {n}\n" in body for n in range(5))
    assert "Pruned" in body and "Fail" in body  # gated and failed trials are shown as such
    assert "x the baseline" in body and "Artifacts" in body and ".yaml" in body
    assert errors == []
    page.close()
