"""Does the page grow as runs are opened? Serves the app, opens bundled traces into slot A in turn
(visiting the detail tabs each time, so hidden figures draw), and prints, after each pick, the
page's element count, plotly figures, SVG roots and the JS heap kept after a garbage collection.
A leak shows as counts that climb for the same trace; counts that repeat per trace mean the page
replaces what it draws.

    python -m benchmarks.page_growth --picks 9      # from the repository root

Needs Debian's chromium and playwright, as the browser tests do.
"""

from __future__ import annotations

import argparse

TRACES = ["default-eqspec-column-positions.json.gz", "default-exspec.json.gz", "gemma-eqspec.json.gz"]
COUNT_JS = """() => [document.querySelectorAll('*').length,
    document.querySelectorAll('.js-plotly-plot').length,
    document.querySelectorAll('svg').length,
    performance.memory ? Math.round(performance.memory.usedJSHeapSize / 1e6) : -1]"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--picks", type=int, default=9, help="bundled traces opened, in turn")
    args = parser.parse_args()

    import app
    from tests.support.browser import served_page, settle

    with served_page(app.build_app()) as page:
        page.wait_for_selector("#sv-grid .js-plotly-plot")
        settle(page)
        cdp = page.context.new_cdp_session(page)

        def counts() -> list[int]:
            cdp.send("HeapProfiler.collectGarbage")  # the heap that is kept, not garbage not yet swept
            return page.evaluate(COUNT_JS)

        print("pick | trace | elements | plotly figures | svg | JS heap MB after a collection")
        print("start", "-", *counts(), sep=" | ")
        for pick in range(args.picks):
            name = TRACES[pick % len(TRACES)]
            page.get_by_label("bundled example trace").first.click()
            page.get_by_role("option", name=name).click()
            settle(page)
            for tab in ("Outputs", "Invariants", "Grid"):
                page.get_by_role("tab", name=tab).first.click()
                settle(page)
            print(pick + 1, name, *counts(), sep=" | ", flush=True)


if __name__ == "__main__":
    main()
