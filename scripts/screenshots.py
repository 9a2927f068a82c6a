"""Make docs/report.png, docs/dashboard-note.png and docs/dashboard-history.png: a simulated study (LLaMA-7B on
an A100 profile, seconds), its report and its dashboard, photographed by headless Chromium (Debian's package).

    .venv/bin/python scripts/screenshots.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDY = "llama-7b-sim-a100-80g"


def main() -> int:
    from playwright.sync_api import sync_playwright

    docs = ROOT / "docs"
    docs.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "AUTOTUNE_CACHE": f"{tmp}/cache", "AUTOTUNE_PLAIN": "1"}
        # Relative paths, so the notes and tables in the pictures read as they would for a user.
        subprocess.run([sys.executable, "-m", "autotune.cli", "search", "--backend", "sim", "--model", "llama-7b",
                        "--hardware", "a100-80g", "--trials", "40", "--study", STUDY, "--seed", "3",
                        "--tpot-slo", "12"], cwd=tmp, env=env, check=True, stdout=subprocess.DEVNULL)
        subprocess.run([sys.executable, "-m", "autotune.cli", "report", "--study", STUDY, "--out", "report.html"],
                       cwd=tmp, env=env, check=True)
        os.chdir(tmp)
        from autotune.results.dashboard import make_dashboard_server

        server = make_dashboard_server(f"sqlite:///studies/{STUDY}.db", Path("studies/artifacts"), "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_address[1]}/dashboard/studies/1"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(Path(tmp, "report.html").as_uri())
            page.wait_for_selector("#pareto .scatterlayer path.point")
            page.screenshot(path=str(docs / "report.png"), clip={"x": 0, "y": 0, "width": 1280, "height": 1500},
                            full_page=True)
            page.goto(base)
            page.wait_for_timeout(4000)
            page.screenshot(path=str(docs / "dashboard-history.png"))
            import optuna

            study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///studies/{STUDY}.db")
            best = max(study.best_trials, key=lambda t: t.values[0])
            page.goto(f"{base}/trials?numbers={best.number}")
            page.get_by_text(f"Pareto point #{best.number}").wait_for(timeout=20_000)
            page.screenshot(path=str(docs / "dashboard-note.png"))
            browser.close()
        server.shutdown()
    for name in ("report.png", "dashboard-history.png", "dashboard-note.png"):
        print(docs / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
