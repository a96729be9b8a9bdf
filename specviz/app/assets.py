"""What the page carries besides components: its CSS, the intro, and the scripts Gradio cannot express.

Static strings only; `specviz.views.outputs` owns the output cards' CSS, appended here.
"""

from __future__ import annotations

from specviz.views.outputs import OUTPUTS_CSS

# A plot drawn while its tab is hidden is laid out at the wrong width (plotly measures a hidden
# container); Gradio does not tell plotly when the tab shows, so do it on every tab switch.
RESIZE_PLOTS_JS = """() => {
  const fit = () => document.querySelectorAll('.js-plotly-plot').forEach((gd) => {
    if (gd.offsetParent !== null && window.Plotly) window.Plotly.Plots.resize(gd);
  });
  requestAnimationFrame(fit);
  setTimeout(fit, 200);
}"""
# gr.Plot has no click event: a click on a timeline marker writes the index of its first violation
# (customdata[2], see views.timeline) into the hidden #sv-timeline-pick box, whose input event jumps.
TIMELINE_CLICK_JS = """() => {
  const send = (data) => {
    const point = data && data.points && data.points[0];
    const index = point && point.customdata ? point.customdata[2] : undefined;
    const box = document.querySelector('#sv-timeline-pick textarea, #sv-timeline-pick input');
    if (index === undefined || index === null || !box) return;
    box.value = `${index}:${Date.now()}`;  // a new value on every click: the same marker twice jumps twice
    box.dispatchEvent(new Event('input', { bubbles: true }));
  };
  // Gradio may draw a new plot element on each update: hook every one that appears.
  setInterval(() => {
    const gd = document.querySelector('#sv-timeline .js-plotly-plot');
    if (gd && gd.on && !gd.__svClick) {
      gd.on('plotly_click', send);
      gd.__svClick = true;
    }
  }, 400);
}"""

CSS = (
    OUTPUTS_CSS
    + """
.sv-summary { min-height: 120px; }
#sv-intro p { margin: 2px 0; }
/* Headers break between words or not at all: "violations", never "violatio ns". The data tables'
   headers stay on one line; the summary's may wrap between words, so its table fits its panel. */
.table-wrap th, th .cell-wrap, th span { word-break: normal !important;
  overflow-wrap: normal !important; white-space: nowrap !important; hyphens: none; }
.sv-summary th { word-break: keep-all !important; overflow-wrap: normal !important; hyphens: none; }
.sv-status { color: #991b1b; background: #fef2f2; border-radius: 6px; padding: 2px 8px; }
.sv-status p { margin: 0; }
/* A plotly click on the timeline is sent through this box; nobody types in it. */
#sv-timeline-pick { display: none !important; }
"""
)

INTRO = """
# specviz: where does batch speculative decoding go wrong?
Load runs into slots **A** and **B** (bundled example, your trace file, or a live run). The **ragged grid** draws one
line per batch row and one cell per token slot, with the fed position ID in each cell. **Red outline**: the fed state
differs from what a correct engine feeds. **Dark red cell**: where desynchronisation begins.
"""
